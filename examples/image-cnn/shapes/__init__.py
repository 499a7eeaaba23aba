"""A small image classifier for trainstack: your own model and TFRecords, as a user would bring them."""

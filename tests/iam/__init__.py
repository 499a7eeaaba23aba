"""Tests that run the machine's real AWS calls with IAM enforced, as the stack's own role."""

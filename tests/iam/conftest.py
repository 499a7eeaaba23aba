"""The IAM-enforced cloud for these tests: moto_server with IAM on, and the authorization layer in front."""

from tests.fixtures.iam_cloud import iam_cloud  # noqa: F401 - a fixture, found by name

"""Tests of the AWS components, run through ops.synth under the Pulumi SDK mocks."""

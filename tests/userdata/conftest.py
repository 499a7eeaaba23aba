"""Fixtures for the boot sandbox tests: a metadata service, an Auto Scaling group, the checkout's
code in the bucket, and sandbox machines (devtools/sandbox.py) powered off after each test."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox, make_group
from tests.fixtures.iam_cloud import iam_cloud  # noqa: F401 - a fixture, found by name (the cross-cloud tests)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.close()


@pytest.fixture
def group(s3_run) -> str:
    """An Auto Scaling group of one machine on moto_server; its name."""
    return make_group(s3_run, 1)


@pytest.fixture
def code_uri(s3_run) -> str:
    """The checkout's trainer packed as the stack packs it, uploaded to the bucket."""
    from components.aws.code import archive_key, pack

    data = pack()
    key = archive_key(data)
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(
        Bucket=s3_run.bucket, Key=key, Body=data)
    return f"s3://{s3_run.bucket}/{key}"


@pytest.fixture
def machines(tmp_path, metadata) -> Iterator:
    """Makes sandbox machines (`machines(run, group, code_uri, **kw)`); powers them off after."""
    made: list[Sandbox] = []

    def make(run, group: str, code_uri: str, **kw) -> Sandbox:
        box = Sandbox(tmp_path / f"machine{len(made)}", run, metadata, group, code_uri, **{"warm_trainer": True, **kw})
        made.append(box)
        return box

    yield make
    for box in made:
        box.power_off()


@pytest.fixture
def sandbox_factory(s3_run, group, code_uri, machines):
    """Makes AWS sandbox machines of the `group` fixture's group, running the checkout's trainer."""

    def make(**kw) -> Sandbox:
        return machines(s3_run, group, kw.pop("code_uri", code_uri), **kw)

    return make

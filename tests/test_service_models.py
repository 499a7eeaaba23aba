"""The test process parses botocore's service models once (`tests/fixtures/service_models.py`):
sessions share the loader of their data path and keep everything else their own."""

from __future__ import annotations

import boto3


def test_sessions_share_the_parsed_models_and_keep_their_own_credentials(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    one = boto3.session.Session(aws_access_key_id="one", aws_secret_access_key="s1", region_name="eu-west-1")
    two = boto3.session.Session(aws_access_key_id="two", aws_secret_access_key="s2", region_name="us-east-1")
    loader = one._session.get_component("data_loader")
    assert loader is two._session.get_component("data_loader")
    a, b = one.client("s3"), two.client("s3")
    assert a._request_signer._credentials.access_key == "one"
    assert b._request_signer._credentials.access_key == "two"
    assert (a.meta.region_name, b.meta.region_name) == ("eu-west-1", "us-east-1")

    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    elsewhere = boto3.session.Session()
    assert elsewhere._session.get_component("data_loader") is not loader
    assert str(tmp_path) in elsewhere._session.get_component("data_loader").search_paths

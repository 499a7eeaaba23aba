"""``s3://`` run roots: boto3 with botocore's adaptive retries, multipart transfers, and every retry reported."""

from __future__ import annotations

from urllib.parse import urlencode

from runfolder import layout
from runfolder.storage import retry
from runfolder.storage.base import ObjectInfo, ObjectStore
from runfolder.storage.errors import Cancelled, NotFound, PreconditionFailed, WriteConflict
from runfolder.storage.retry import is_transient, is_transient_answer


class S3Store(ObjectStore):
    """A run root in an S3 bucket (or anything speaking S3 at ``AWS_ENDPOINT_URL``)."""

    scheme = "s3"

    def __init__(self, uri: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        super().__init__(uri)
        self.bucket = self.bucket_name
        self._config = Config(
            retries={"mode": "adaptive", "max_attempts": retry.S3_MAX_ATTEMPTS},
            connect_timeout=retry.CONNECT_TIMEOUT_S,
            read_timeout=retry.READ_TIMEOUT_S,
            max_pool_connections=32,
        )
        # boto3 reads AWS_ENDPOINT_URL and the region from the environment itself.
        self.client = boto3.session.Session().client("s3", config=self._config)
        self.client.meta.events.register_first("needs-retry.s3", self._observe_retry)
        # 8 MiB parts, 8 in parallel: a 100 MB checkpoint is 13 parts in flight together.
        self._transfer = TransferConfig(
            multipart_threshold=8 * 1024 * 1024,
            multipart_chunksize=8 * 1024 * 1024,
            max_concurrency=8,
            use_threads=True,
        )

    def _observe_retry(
        self, response=None, attempts=0, caught_exception=None, operation=None, request_dict=None, **_: object
    ):
        """See each failed attempt botocore is about to retry; returns None so botocore decides.

        A request that ended because its upload was cancelled (botocore wraps our
        :class:`Cancelled` in a retryable ``HTTPClientError``) is never retried: False says so.
        """
        wrapped = getattr(caught_exception, "kwargs", None) or {}
        if isinstance(caught_exception, Cancelled) or isinstance(wrapped.get("error"), Cancelled):
            return False
        if attempts >= retry.S3_MAX_ATTEMPTS:
            return None
        error: BaseException | None = None
        if caught_exception is not None and is_transient(caught_exception):
            error = caught_exception
        elif response is not None:
            http, parsed = response
            status = getattr(http, "status_code", 0) or 0
            code = (parsed or {}).get("Error", {}).get("Code", "")
            if is_transient_answer(status, code):
                error = RuntimeError(f"HTTP {status} {code}".strip())
        if error is not None:
            name = getattr(operation, "name", "s3")
            params = ((request_dict or {}).get("context") or {}).get("input_params") or {}
            self._notify_retry(name, self._key(params.get("Key") or params.get("Prefix") or ""), attempts, error)
        return None

    def _not_found(self, e: BaseException, key: str) -> bool:
        import botocore.exceptions as bx

        if isinstance(e, bx.ClientError):
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchKey", "NotFound") or status == 404:
                return True
            if code in ("403", "AccessDenied", "Forbidden") or status == 403:
                # S3 answers 403, not 404, for a missing key when the caller may list the
                # bucket only under a prefix (the machine role lists just runs/<id>/*): a
                # HEAD/GET carries no prefix, so the ListBucket condition does not match.
                # Listing with the key itself as prefix is allowed; no such key = absent.
                return not self._listed(key)
        return False

    def _listed(self, key: str) -> bool:
        name = self._name(key)
        resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=name, MaxKeys=1)
        return any(o["Key"] == name for o in resp.get("Contents", []))

    @staticmethod
    def _tagging(key: str) -> dict[str, str]:
        """The checkpoint tag for a checkpoint's object (the bucket's short noncurrent rule filters on it), else nothing.

        Sent with the upload itself (PutObject / CreateMultipartUpload ``x-amz-tagging``), so each
        version carries it from its first byte: S3 keeps tags per version, and a version pruned
        later still matches the rule. AWS checks ``s3:PutObjectTagging`` for a write that carries tags.
        """
        if not layout.is_checkpoint_key(key):
            return {}
        return {"Tagging": urlencode({layout.CHECKPOINT_TAG_KEY: layout.CHECKPOINT_TAG_VALUE})}

    def _put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data, **self._tagging(key))

    def _get_bytes(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
            return resp["Body"].read()
        except Exception as e:
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        import botocore.exceptions as bx

        wanted = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._name(key), Range=wanted)
            return resp["Body"].read()
        except bx.ClientError as e:
            # 416 InvalidRange: the object ends before `start` (or is empty): nothing to read there.
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 416 or e.response.get("Error", {}).get("Code") == "InvalidRange":
                if not self._exists(key):
                    raise NotFound(f"{self.uri}/{key}") from e
                return b""
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
            return resp["Body"].read(), resp["ETag"]
        except Exception as e:
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _put_bytes_if(self, key: str, data: bytes, version: str | None) -> str:
        import botocore.exceptions as bx

        cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data, **cond)
        except bx.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            # 409 ConditionalRequestConflict: another write to the key was in flight and S3
            # decided nothing about this one; it says to read again and retry. Not a refusal.
            if status == 409 or code == "ConditionalRequestConflict":
                raise WriteConflict(f"{self.uri}/{key}: {code or status} (another write to it was in flight)") from e
            # 412: the ETag differs, or the object exists (create-only). 404: If-Match on an
            # object that is gone. Each is a refusal: "read again".
            if status in (404, 412) or code in ("PreconditionFailed", "NoSuchKey"):
                raise PreconditionFailed(f"{self.uri}/{key}: {code or status} "
                                         f"({'exists' if version is None else 'changed since ' + version})") from e
            raise
        return resp["ETag"]

    def _put_file(self, key: str, path: str, cancel) -> None:
        extra = self._tagging(key) or None
        if cancel is None:
            self.client.upload_file(path, self.bucket, self._name(key), ExtraArgs=extra, Config=self._transfer)
            return

        def stop_if_cancelled(_sent: int) -> None:
            # s3transfer calls this as each request reads its body, a few KiB at a time, while
            # sending: raising here ends the request mid-body, fails the transfer and aborts
            # the multipart upload (nothing is published).
            if cancel.is_set():
                raise Cancelled(f"upload of {self.uri}/{key} cancelled")

        try:
            self.client.upload_file(path, self.bucket, self._name(key), ExtraArgs=extra, Config=self._transfer,
                                    Callback=stop_if_cancelled)
        except Exception as e:
            if cancel.is_set():
                raise Cancelled(f"upload of {self.uri}/{key} cancelled") from e
            raise

    def _get_file(self, key: str, path: str) -> None:
        try:
            self.client.download_file(self.bucket, self._name(key), path, Config=self._transfer)
        except Exception as e:
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._name(key))
            return True
        except Exception as e:
            if self._not_found(e, key):
                return False
            raise

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        out: dict[str, ObjectInfo] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._name(prefix))
        for page in pages:
            for obj in page.get("Contents", []):
                out[self._key(obj["Key"])] = ObjectInfo(int(obj["Size"]), obj["LastModified"])
        return out

    def _folders(self, prefix: str) -> set[str]:
        out: set[str] = set()
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._name(prefix),
                                                                      Delimiter="/")
        for page in pages:
            out.update(self._key(p["Prefix"]) for p in page.get("CommonPrefixes", []))
        return out

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._name(k)} for k in keys[i : i + 1000]]
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"could not delete {len(errors)} objects under {self.uri}, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )


"""Which storage errors are worth retrying, and the retry policy around a whole transfer.

One classification for every backend: HTTP 5xx, 429 and the throttling codes of the S3
API, connection resets and timeouts of botocore and requests, google-api-core's server
errors, and a few transient local errnos. :func:`is_transient` walks an exception's
cause chain (boto3's transfer manager wraps the error it gave up on).

The backoff jitter comes from a private random generator, never the process-wide one:
Keras draws the seeds of unseeded initializers from Python's global ``random``, so a
retry drawing from it while a model is being built would change the model's initial
weights (see ``trainer.models.seeded_model``).
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable

import tenacity

from runfolder.storage.errors import Cancelled, NotFound, PreconditionFailed

# A preempted machine has ~30 s (GCE) to ~2 min (EC2) of notice: a transfer must give up
# on a dead endpoint quickly and try again rather than hang.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 15
S3_MAX_ATTEMPTS = 10
# The outer retry sits on top of the client libraries' own retries, so it stays short.
TRANSFER_ATTEMPTS = 5
TRANSFER_MAX_SECONDS = 60
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0

RetryHook = Callable[[str, str, int, BaseException], None]

_TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY, errno.ESTALE}
THROTTLE_CODES = frozenset({
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
})

# Our own jitter; see the module docstring for why it must not be `random`'s global one.
_jitter_rng = random.Random()  # noqa: S311 - backoff jitter, not cryptography


def is_transient_answer(status: int, code: str = "") -> bool:
    """True for an HTTP answer worth retrying: 5xx, 429 or a throttling/internal error code."""
    return status >= 500 or status == 429 or code in THROTTLE_CODES


def _is_transient_one(exc: BaseException) -> bool:
    # Imported lazily: a file:// run must not need the cloud libraries to be importable.
    try:
        import botocore.exceptions as bx
    except ImportError:  # pragma: no cover - boto3 is a trainer requirement
        bx = None
    if bx is not None:
        if isinstance(exc, bx.ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = exc.response.get("Error", {}).get("Code", "")
            return is_transient_answer(status, code)
        if isinstance(
            exc, bx.ConnectionError | bx.HTTPClientError | bx.IncompleteReadError | bx.ResponseStreamingError
        ):
            return True
    try:
        import google.api_core.exceptions as gx
        import requests.exceptions as rx
    except ImportError:  # pragma: no cover - google-cloud-storage is a trainer requirement
        gx = rx = None
    if gx is not None:
        if isinstance(exc, gx.TooManyRequests | gx.ServerError | gx.RetryError):
            return True
        if isinstance(exc, rx.ConnectionError | rx.Timeout | rx.ChunkedEncodingError):
            return True
        try:
            from google.resumable_media import common as rm
        except ImportError:  # pragma: no cover
            rm = None
        if rm is not None:
            if isinstance(exc, rm.DataCorruption):
                return True
            if isinstance(exc, rm.InvalidResponse):
                return is_transient_answer(getattr(exc.response, "status_code", 0) or 0)
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an error it wraps) is worth retrying: network, throttling, 5xx.

    boto3's transfer manager wraps the client error it gave up on, so the whole
    cause/context chain is examined.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, NotFound | PreconditionFailed | Cancelled | ValueError | PermissionError | FileNotFoundError):
            return False
        if _is_transient_one(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class _Backoff(tenacity.wait.wait_base):
    """Exponential backoff with jitter from :data:`_jitter_rng` (tenacity's own uses the global one)."""

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exp = BACKOFF_INITIAL_S * 2.0 ** (retry_state.attempt_number - 1)
        return min(BACKOFF_MAX_S, exp + _jitter_rng.uniform(0, BACKOFF_INITIAL_S))


def retrying(fn: Callable[[], object], *, on_retry: Callable[[int, BaseException], None]) -> object:
    """Run ``fn`` and retry it on transient errors (bounded attempts and time); ``on_retry(n, error)`` first."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None:
            on_retry(state.attempt_number, exc)

    retryer = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(TRANSFER_ATTEMPTS) | tenacity.stop_after_delay(TRANSFER_MAX_SECONDS),
        wait=_Backoff(),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retryer(fn)

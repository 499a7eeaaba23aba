"""Which storage errors are retried (runfolder/storage/retry.py): each kind the clients raise, the
answers at the edges of "transient", the cause chain, and the retry loop's bounds and backoff."""

from __future__ import annotations

import errno
import types

import botocore.exceptions as bx
import google.api_core.exceptions as gx
import pytest
import requests.exceptions as rx
import tenacity
from google.resumable_media import common as rm

from runfolder.storage import retry
from runfolder.storage.errors import Cancelled, NotFound, PreconditionFailed, WriteConflict


@pytest.mark.parametrize(("status", "code", "expected"), [
    (500, "", True), (503, "", True), (599, "", True),
    (499, "", False), (400, "", False), (404, "NoSuchKey", False), (200, "", False),
    (429, "", True), (428, "", False), (430, "", False),
    (400, "SlowDown", True), (400, "RequestTimeout", True), (400, "Throttling", True),
    (400, "AccessDenied", False), (0, "", False),
])
def test_an_answer_is_transient_for_5xx_429_and_the_throttling_codes(status, code, expected):
    assert retry.is_transient_answer(status, code) is expected


def _client_error(status, code):
    return bx.ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def _response(status):
    return types.SimpleNamespace(status_code=status)


TRANSIENT = {
    "client-503": _client_error(503, ""),
    "client-throttled": _client_error(400, "SlowDown"),
    "boto-connection": bx.EndpointConnectionError(endpoint_url="http://x"),
    "boto-http-client": bx.HTTPClientError(error="broken pipe"),
    "boto-incomplete": bx.IncompleteReadError(actual_bytes=1, expected_bytes=2),
    "boto-streaming": bx.ResponseStreamingError(error="reset"),
    "gcs-429": gx.TooManyRequests("slow down"),
    "gcs-500": gx.InternalServerError("oops"),
    "gcs-503": gx.ServiceUnavailable("later"),
    "gcs-retry": gx.RetryError("gave up", cause=None),
    "requests-connection": rx.ConnectionError("reset"),
    "requests-timeout": rx.ReadTimeout("slow"),
    "requests-chunked": rx.ChunkedEncodingError("cut"),
    "media-corrupt": rm.DataCorruption(_response(200), "checksum"),
    "media-503": rm.InvalidResponse(_response(503), "bad"),
    "builtin-connection": ConnectionResetError(),
    "builtin-timeout": TimeoutError(),
    **{f"errno-{errno.errorcode[n]}": OSError(n, "transient") for n in sorted(retry._TRANSIENT_ERRNOS)},
}
PERMANENT = {
    "client-403": _client_error(403, "AccessDenied"),
    "client-missing-metadata": bx.ClientError({}, "GetObject"),
    "gcs-404": gx.NotFound("gone"),
    "gcs-403": gx.Forbidden("no"),
    "media-404": rm.InvalidResponse(_response(404), "missing"),
    "media-no-status": rm.InvalidResponse(types.SimpleNamespace(), "odd"),
    "errno-enospc": OSError(errno.ENOSPC, "full"),
    "oserror-no-errno": OSError("plain"),
    "runtime": RuntimeError("bug"),
    "key": KeyError("x"),
}


@pytest.mark.parametrize("name", TRANSIENT)
def test_transient_errors_of_every_client_are_retried(name):
    assert retry.is_transient(TRANSIENT[name]) is True


@pytest.mark.parametrize("name", PERMANENT)
def test_other_errors_are_not_retried(name):
    assert retry.is_transient(PERMANENT[name]) is False


def _chain(outer: BaseException, inner: BaseException, *, how: str) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            if how == "cause":
                raise outer from e
            raise outer  # noqa: B904 - the implicit context is what this case is about
    except BaseException as e:
        return e


@pytest.mark.parametrize("how", ["cause", "context"])
def test_a_wrapped_transient_error_is_retried(how):
    assert retry.is_transient(_chain(RuntimeError("gave up"), _client_error(503, ""), how=how)) is True
    # Deeper: the wrapper of a wrapper.
    inner = _chain(RuntimeError("level 1"), ConnectionResetError(), how=how)
    assert retry.is_transient(_chain(RuntimeError("level 2"), inner, how=how)) is True


@pytest.mark.parametrize("final", [NotFound("k"), PreconditionFailed("k"), WriteConflict("k"), Cancelled("c"),
                                   ValueError("bad key"), PermissionError("denied"), FileNotFoundError("gone")])
def test_an_answer_that_is_final_is_never_retried_whatever_it_wraps(final):
    # e.g. a NotFound raised while handling a 503: the store's own answer decides.
    assert retry.is_transient(_chain(final, _client_error(503, ""), how="cause")) is False
    assert retry.is_transient(_chain(final, ConnectionResetError(), how="context")) is False


def test_a_cause_chain_that_loops_ends():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert retry.is_transient(a) is False


def _state(attempt: int) -> tenacity.RetryCallState:
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return state


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5])
def test_the_backoff_doubles_from_the_initial_wait_with_a_bounded_jitter(attempt):
    base = retry.BACKOFF_INITIAL_S * 2 ** (attempt - 1)
    waits = [retry._Backoff()(_state(attempt)) for _ in range(200)]
    assert all(base <= w <= min(retry.BACKOFF_MAX_S, base + retry.BACKOFF_INITIAL_S) for w in waits), waits
    if base + retry.BACKOFF_INITIAL_S <= retry.BACKOFF_MAX_S:
        assert max(waits) - min(waits) > 0  # jittered, not one fixed wait


def test_the_backoff_stops_growing_at_its_maximum():
    assert retry._Backoff()(_state(30)) == retry.BACKOFF_MAX_S


class _NoWait(tenacity.wait.wait_base):
    """The backoff, asked before each retry, answering 0 s (the tries it was asked for are kept)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        self.asked.append(retry_state.attempt_number)
        return 0.0


@pytest.fixture
def no_waits(monkeypatch):
    wait = _NoWait()
    monkeypatch.setattr(retry, "_Backoff", lambda: wait)
    return wait


def test_a_transient_error_is_retried_until_the_call_succeeds(no_waits):
    calls, seen = [], []

    def fn():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(f"try {len(calls)}")
        return "done"

    assert retry.retrying(fn, on_retry=lambda n, e: seen.append((n, str(e)))) == "done"
    assert seen == [(1, "try 1"), (2, "try 2")]
    assert no_waits.asked == [1, 2]  # the backoff decides each pause


def test_retries_stop_after_the_bounded_attempts_with_the_last_error(no_waits):
    calls, seen = [], []

    def fn():
        calls.append(1)
        raise ConnectionResetError(f"try {len(calls)}")

    with pytest.raises(ConnectionResetError, match=f"try {retry.TRANSFER_ATTEMPTS}"):
        retry.retrying(fn, on_retry=lambda n, e: seen.append(n))
    assert len(calls) == retry.TRANSFER_ATTEMPTS
    assert seen == list(range(1, retry.TRANSFER_ATTEMPTS))


def test_a_permanent_error_is_raised_at_once(no_waits):
    calls, seen = [], []

    def fn():
        calls.append(1)
        raise NotFound("k")

    with pytest.raises(NotFound):
        retry.retrying(fn, on_retry=lambda n, e: seen.append(n))
    assert (len(calls), seen) == (1, [])


@pytest.mark.parametrize("missing", ["botocore.exceptions", "google.api_core.exceptions", "google.resumable_media"])
def test_errors_are_classified_when_a_cloud_library_is_not_installed(monkeypatch, missing):
    # A file:// run must not need the cloud libraries: each is imported when needed, and its
    # absence only means its errors cannot occur.
    import sys

    monkeypatch.setitem(sys.modules, missing, None)  # importing it now raises ImportError
    assert retry.is_transient(ConnectionResetError()) is True
    assert retry.is_transient(OSError(errno.EIO, "io")) is True
    assert retry.is_transient(RuntimeError("bug")) is False

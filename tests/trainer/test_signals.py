"""The stop requests in process: SIGTERM/SIGINT set the flag the loop checks, a second Ctrl-C
aborts, the handlers come back after a library took them, and the run folder's STOP is polled.

tests/trainer/test_stop.py runs whole trainers for the same promises (seconds each); these call
`trainer.signals` directly, with the signals raised in this process and a fake store.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from runfolder import layout
from runfolder.storage import NotFound
from trainer.signals import STOP_POLL_SECONDS, StopKeyPoller, StopRequest, _reason

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@pytest.fixture(autouse=True)
def _own_handlers():
    """Each test starts from plain handlers of its own and leaves the process's as they were."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    first = {s: (lambda signum, frame: None) for s in SIGNALS}
    for s, h in first.items():
        signal.signal(s, h)
    yield first
    for s, h in saved.items():
        signal.signal(s, h)


def _clean(sig):
    """Raise `sig` where it must stop cleanly: an abort fails the test (pytest would take a stray
    KeyboardInterrupt for the user's and end the session)."""
    try:
        signal.raise_signal(sig)
    except KeyboardInterrupt:
        pytest.fail(f"{sig.name} aborted where it should only have set the stop")


def _in_thread(fn):
    done = []
    t = threading.Thread(target=lambda: done.append(fn()))
    t.start()
    t.join(10)
    assert done, "the call did not end in its thread"
    return done[0]


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_sets_the_stop_and_names_itself(sig):
    stop = StopRequest()
    assert stop.install() is stop
    assert not stop.requested and stop.signal_name is None
    _clean(sig)
    assert stop.requested and stop.event.is_set()
    assert stop.signal_name == sig.name


def test_install_takes_both_signals_and_restore_gives_back_the_handlers_it_found(_own_handlers):
    stop = StopRequest().install()
    for s in SIGNALS:
        assert signal.getsignal(s) == stop._handle
    stop.restore()
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]
    assert stop._old == {}
    # A restored request can be installed again, and restored again to the same handlers.
    stop.install()
    assert signal.getsignal(signal.SIGTERM) == stop._handle
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) is _own_handlers[signal.SIGTERM]


def test_a_second_install_keeps_the_first_handlers_to_restore(_own_handlers):
    stop = StopRequest().install()
    stop.install()  # `python -m trainer` installs early, the script mode again later
    stop.restore()
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]


def test_install_outside_the_main_thread_changes_nothing(_own_handlers):
    stop = StopRequest()
    assert _in_thread(stop.install) is stop
    assert stop._old == {}
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]


def test_a_second_ctrl_c_aborts_at_once():
    stop = StopRequest().install()
    _clean(signal.SIGINT)
    assert stop.requested
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_ctrl_c_after_a_spot_notice_aborts_but_a_second_notice_does_not():
    stop = StopRequest().install()
    _clean(signal.SIGTERM)
    _clean(signal.SIGTERM)  # the watcher may send it twice: still a clean stop
    assert stop.requested and stop.signal_name == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_a_notice_after_ctrl_c_is_still_a_clean_stop():
    stop = StopRequest().install()
    _clean(signal.SIGINT)
    _clean(signal.SIGTERM)
    assert stop.signal_name == "SIGTERM"


def test_reclaim_takes_the_signals_back_from_a_library(_own_handlers):
    stop = StopRequest().install()
    library = {s: (lambda signum, frame: None) for s in SIGNALS}
    for s, h in library.items():
        signal.signal(s, h)  # TensorFlow's preemption notifier, say
    _clean(signal.SIGTERM)
    assert not stop.requested
    stop.reclaim()
    for s in SIGNALS:
        assert signal.getsignal(s) == stop._handle
    _clean(signal.SIGTERM)
    assert stop.requested and stop.signal_name == "SIGTERM"
    # Restoring gives back what was there before the first install, not the library's.
    stop.restore()
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]


def test_reclaim_without_install_still_restores_what_it_found(_own_handlers):
    stop = StopRequest()
    stop.reclaim()
    assert signal.getsignal(signal.SIGINT) == stop._handle
    stop.restore()
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]


def test_reclaim_outside_the_main_thread_changes_nothing(_own_handlers):
    stop = StopRequest()
    _in_thread(stop.reclaim)
    assert stop._old == {}
    for s in SIGNALS:
        assert signal.getsignal(s) is _own_handlers[s]


class _Store:
    """Answers `get_bytes(STOP)` from a script: an exception to raise, or bytes."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked: list[str] = []

    def get_bytes(self, key):
        self.asked.append(key)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _wait(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_the_poller_looks_at_once_and_stops_polling_once_found():
    store = _Store(json.dumps({layout.MARKER_REASON: "budget reached"}).encode())
    poller = StopKeyPoller(store, every=3600)
    assert not poller.requested and poller.reason is None
    assert poller.start() is poller
    _wait(lambda: poller.requested)
    assert poller.event.is_set() and poller.reason == "budget reached"
    poller._thread.join(5)
    assert not poller._thread.is_alive()  # found: no more polls
    assert store.asked == [layout.STOP_KEY]


def test_the_poller_asks_again_after_a_missing_key_or_a_store_error():
    store = _Store(NotFound("STOP"), OSError("connection reset"), NotFound("STOP"), b"")
    poller = StopKeyPoller(store, every=0.001).start()
    _wait(lambda: poller.requested)
    assert len(store.asked) == 4
    assert poller.reason == "stop requested (STOP in the run folder)"
    poller.close()


def test_the_poller_waits_its_interval_and_close_ends_it():
    store = _Store(NotFound("STOP"))
    poller = StopKeyPoller(store, every=3600).start()
    _wait(lambda: len(store.asked) == 1)
    time.sleep(0.05)
    assert len(store.asked) == 1 and not poller.requested
    poller.close()
    poller._thread.join(5)
    assert not poller._thread.is_alive() and not poller.requested


def test_starting_the_poller_twice_polls_on_one_thread():
    store = _Store(NotFound("STOP"))
    poller = StopKeyPoller(store, every=3600).start()
    thread = poller._thread
    assert poller.start() is poller and poller._thread is thread
    assert thread.name == "stop-key" and thread.daemon
    _wait(lambda: len(store.asked) >= 1)
    time.sleep(0.05)
    assert len(store.asked) == 1
    poller.close()


def test_the_poller_polls_every_ten_seconds_by_default():
    assert StopKeyPoller(_Store(b"")).every == STOP_POLL_SECONDS == 10.0


@pytest.mark.parametrize(("raw", "reason"), [
    (json.dumps({"reason": "budget reached", "by": "ops stop"}).encode(), "budget reached"),
    (json.dumps({"reason": "x" * 600}).encode(), "x" * 500),
    (json.dumps({"reason": 42}).encode(), "42"),
    (b"  out of money \n", "out of money"),
    (("y" * 600).encode(), "y" * 500),
    (json.dumps({"by": "ops stop"}).encode(), '{"by": "ops stop"}'),
    (json.dumps({"reason": ""}).encode(), '{"reason": ""}'),
    (b'["reason"]', '["reason"]'),
    (b"", "stop requested (STOP in the run folder)"),
    (b"  \n", "stop requested (STOP in the run folder)"),
    (b"caf\xe9", "caf\ufffd"),
])
def test_the_stop_reason_is_what_stop_says(raw, reason):
    assert _reason(raw) == reason

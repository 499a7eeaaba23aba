"""Helpers for the ops tests."""

import signal


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for a command a test stops with Ctrl-C (SIGINT).

    A process started in the background by a non-interactive shell (a CI runner, `nohup ... &`)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    command under test would never see the test's Ctrl-C. A user's terminal delivers it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)

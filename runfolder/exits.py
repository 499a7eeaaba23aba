"""The exit codes of ``python -m trainer`` (and of a user's script under it), which the machines act on.

The trainer returns them; ``userdata/supervise.sh`` decides from them whether to run the trainer
again, hand the machine back, or stop (``lib.sh`` holds a copy as ``EXIT_<NAME>``, checked against
this module by ``tests/userdata/test_layout_names.py``); the controller and ``ops`` read the
``exit_code`` a ``failed`` event carries.
"""

from __future__ import annotations

OK = 0  # the run ended: COMPLETE (or CANCELLED) is written
FAILED = 1  # this attempt failed; another attempt may succeed
NO_CLUSTER = 75  # the workers could not form their cluster in time (a peer missing): not this machine's failure
PEER_LOST = 76  # a peer was lost during training (collective error): not this machine's failure
LEASE_HELD = 77  # another machine's trainer holds the run's lease (it is training this run): not this machine's failure
UNUSABLE = 78  # this machine can never run this run (e.g. the GPUs asked for are not seen): no retry
PREEMPTED = 143  # stopped by a signal after a committed checkpoint

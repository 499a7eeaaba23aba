"""``python -m controller.replay TRACE.jsonl [--policy cheapest|inOrder]``: replay a price history.

The command line only, under the controller's name: the replay itself (the trace's format, the simulated world,
what it prints) is :mod:`simworld.replay`. The controller's function never runs it, and its package leaves this
file out (components/function_package.py's ``NOT_SHIPPED``).
"""

from __future__ import annotations

import sys

from simworld.replay import main

if __name__ == "__main__":
    sys.exit(main())

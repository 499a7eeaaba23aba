"""`python -m trainer`: parse the config, train, exit with the run's code (0, 143 or failure)."""

from __future__ import annotations

import os
import sys

# TensorFlow's C++ start-up chatter would bury the event lines; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    from trainer.signals import StopRequest

    stop = StopRequest().install()
    from trainer.config import ConfigError, load_config

    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2
    from trainer.loop import train

    return train(cfg, stop=stop)


if __name__ == "__main__":
    sys.exit(main())

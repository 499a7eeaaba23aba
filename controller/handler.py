"""The function's entry point: ``handler(event, context)`` runs one tick (AWS Lambda's signature;
a GCP job calls :func:`main`).

The configuration is the ``TRAINSTACK_PLACEMENTS`` variable (:mod:`controller.config`) and, for the
price decision, ``controller/decision.json`` in the function's package (:mod:`controller.choice`). The
answer is the tick's result as JSON (the function's log keeps it). A tick that fails raises
after saying why: the scheduler's next call starts again from what the run folder records.
"""

from __future__ import annotations

import json
import os
import sys
import time

from controller.choice import InputsError, load_inputs, prices_budget
from controller.clouds import Clouds
from controller.config import ENV_VAR, ConfigError, parse
from controller.prices import live_fetch
from controller.tick import tick


def handler(event=None, context=None) -> dict:
    """One tick for the configuration in ``TRAINSTACK_PLACEMENTS``; returns what it did."""
    text = os.environ.get(ENV_VAR)
    if not text:
        raise ConfigError(f"{ENV_VAR} is not set: the stack sets it on the function")
    config = parse(text)
    inputs = load_inputs(config)
    clouds, now = Clouds(), time.time()
    placements = {p.index: p for p in config.placements}

    def prices():
        return live_fetch(clouds, placements, now=now, out_of_time=prices_budget())

    result = tick(config, clouds, now, clock=time.time, inputs=inputs, prices=prices).to_json()
    print(json.dumps({"run_uri": config.run_uri, **result}), flush=True)
    return result


def main() -> int:
    """``python -m controller.handler``: one tick (a Cloud Run job's command)."""
    try:
        handler()
    except (ConfigError, InputsError) as e:
        print(f"controller: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

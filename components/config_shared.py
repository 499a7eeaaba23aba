"""What the stack config shares with code that cannot import pydantic: secret patterns and defaults.

`components.settings` (the validated config, pydantic) and `policy.rules` (the security
rules, run by the policy pack in its own virtualenv with the standard library only) both
import this module, so neither imports the other and each pattern and default is written
once. Standard library only.
"""

from __future__ import annotations

import re

# -- secrets: no config value and no resource input may hold one --

SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("a private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("an AWS secret access key", re.compile(r"aws_secret_access_key\s*[=:]", re.I)),
    ("a GCP service account key", re.compile(r"\"private_key(_id)?\"\s*:")),
)


def secret_kind(text: str) -> str | None:
    """What kind of secret `text` holds ("an AWS access key id", ...), or None."""
    for kind, pat in SECRET_PATTERNS:
        if pat.search(text):
            return kind
    return None


# -- defaults of the keys the policy rules read from the raw config (the pack has no pydantic) --

DEFAULT_SPOT = True
"""compute.spot: spot machines unless the user says otherwise."""
DEFAULT_KEEP_ON_DESTROY = True
"""storage.keepOnDestroy: the bucket and its data outlive `pulumi destroy`."""
DEFAULT_ALLOWED_CIDRS: tuple[str, ...] = ()
"""access.allowedCidrs: nobody may reach port 22."""
DEFAULT_RUN_ID = ""
"""run.id: empty means the run is named after the stack."""


def run_id_or_stack(run_id: str | None, stack: str | None) -> str | None:
    """The run's id: run.id when set, else the stack's name (the one rule for both readers)."""
    return run_id or stack

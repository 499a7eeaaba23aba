"""The tags (AWS) and labels (GCP) every taggable resource of a stack carries.

One function decides the keys and values, so a run's machines, volumes, bucket and
role can all be found (and billed) by project, stack and run. GCP labels are stricter
than AWS tags: lowercase letters, digits, '_' and '-', at most 63 characters; a label
that cannot be made to fit is dropped rather than sent to be refused by the API.
"""

from __future__ import annotations

import re

PROJECT_KEY = "trainstack-project"
STACK_KEY = "trainstack-stack"
RUN_KEY = "trainstack-run"
MANAGED_BY_KEY = "managed-by"

_GCP_LABEL = re.compile(r"^[_\-a-z0-9]{0,63}$")


def base_tags(*, project: str, stack: str, run_id: str) -> dict[str, str]:
    """The project/stack/run tags, exactly as AWS receives them."""
    return {
        PROJECT_KEY: project,
        STACK_KEY: stack,
        RUN_KEY: run_id,
        MANAGED_BY_KEY: "pulumi",
    }


def aws_tags(*, project: str, stack: str, run_id: str, name: str | None = None) -> dict[str, str]:
    """AWS tags for one resource; `name` becomes the console's `Name` tag when given."""
    tags = base_tags(project=project, stack=stack, run_id=run_id)
    if name:
        tags["Name"] = name
    return tags


def gcp_labels(*, project: str, stack: str, run_id: str) -> dict[str, str]:
    """GCP labels: the same keys, lowercased, keeping only pairs GCE accepts."""
    labels = {}
    for key, value in base_tags(project=project, stack=stack, run_id=run_id).items():
        k, v = key.lower(), value.lower()
        # A key must also start with a letter; the value may be empty.
        if k[:1].isalpha() and _GCP_LABEL.fullmatch(k) and _GCP_LABEL.fullmatch(v):
            labels[k] = v
    return labels

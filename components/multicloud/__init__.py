"""The placements of a stack, across clouds: the one floor above `components.aws` and `components.gcp`.

Each cloud's package builds its own cloud's resources only, and neither imports the other. This package walks
the stack's placement list once: it names every placement's group (each as its own cloud names groups), moves
the stack's settings to each placement, and hands the home stack a builder for the placements on the other
cloud, which calls that cloud's package together with the federation pieces that join the two
(`aws_placements`: a GCP home's AWS placements; `gcp_placements`: an AWS home's GCP placements). It is a
package, not a module, because each direction's federation is a room of its own, and the only place allowed
to import both clouds.
"""

from __future__ import annotations

import importlib

from components import placement, pricing, registry
from components.aws import naming as aws_naming
from components.common import OtherCloud, Placements, StackOutputs, TrainingStackArgs
from components.gcp import naming as gcp_naming
from components.settings import Settings

# Each cloud's name for the home group (placement i's group is `placement.group_name(home, i)`).
GROUP_NAMES = {"aws": aws_naming.group_name, "gcp": gcp_naming.group_name}


def plan(settings: Settings, project: str) -> Placements:
    """Every placement's group name and settings, the controller's configuration, and the other cloud's builder."""
    s = settings
    places = s.placement_list
    groups = [placement.group_name(GROUP_NAMES[p.cloud](project=project, stack=s.stack, run_id=s.run_id), i)
              for i, p in enumerate(places)]
    moved = [placement.settings_at(s, i) for i in range(len(places))]
    return Placements(
        groups=groups,
        settings=moved,
        config=lambda run, access: placement.controller_config_json(s, run, groups, access),
        decision=pricing.decision_json(s),
        other_cloud=_other_cloud(s, project, groups, moved),
    )


def _other_cloud(s: Settings, project: str, groups: list[str], moved: list[Settings]) -> OtherCloud | None:
    if all(p.cloud == s.cloud for p in s.placement_list):
        return None
    if s.cloud == "aws":
        from components.multicloud.gcp_placements import GcpPlacements

        return GcpPlacements(s, groups, moved)
    from components.multicloud.aws_placements import AwsPlacements

    return AwsPlacements(s, groups, moved, aws_home_group=aws_naming.group_name(project=project, stack=s.stack,
                                                                                run_id=s.run_id))


def training_stack(name: str, settings: Settings, *, project: str, adopt_bucket: bool = False) -> StackOutputs:
    """The home cloud's TrainingStack, with every placement (on either cloud) planned here; the image pinned by
    its digest first (components/registry.py: a tag is resolved here, once, for every machine); with
    `scheduler: kubernetes` the run's Job on the user's cluster (components/kubernetes/) instead."""
    settings = registry.pinned(settings)
    if settings.scheduler == "kubernetes":
        from components.kubernetes.stack import TrainingStack

        return TrainingStack(name, TrainingStackArgs(settings=settings, project=project, adopt_bucket=adopt_bucket))
    cloud = importlib.import_module(f"components.{settings.cloud}")
    return cloud.TrainingStack(name, TrainingStackArgs(settings=settings, project=project, adopt_bucket=adopt_bucket,
                                                       placements=plan(settings, project)))

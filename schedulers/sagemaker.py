"""The SageMaker room: a run as one managed-spot training job.

What the stack names (EC2 instance types such as ``g5.xlarge``) becomes what SageMaker
takes (``ml.g5.xlarge``); the types SageMaker trains on are botocore's own enumeration of
``TrainingInstanceType``, so a type SageMaker lacks is refused before anything is created.
"""

from __future__ import annotations

import functools

# SageMaker's names for an EC2 type: the same, with this prefix.
ML_PREFIX = "ml."


@functools.cache
def service_model():
    """botocore's SageMaker service model (loaded once: ~0.3 s)."""
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def training_instance_types() -> tuple[str, ...]:
    """Every instance type a SageMaker training job takes, as botocore's model lists them."""
    return tuple(service_model().shape_for("TrainingInstanceType").enum)


def instance_type(ec2_type: str) -> str:
    """SageMaker's name for the stack's EC2 type: ``g5.xlarge`` -> ``ml.g5.xlarge``."""
    return ec2_type if ec2_type.startswith(ML_PREFIX) else ML_PREFIX + ec2_type

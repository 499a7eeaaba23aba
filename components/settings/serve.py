"""The `trainstack:serve` block: `tensorflow/serving` for a COMPLETE run's model, on the run's cluster.

Serving runs beside the Job (scheduler kubernetes), in the run's namespace, as a Deployment and a Service
(components/kubernetes/serving.py). `pulumi up` does not deploy it: the model exists only once the run is
COMPLETE, hours later; `ops serve` publishes the model and applies the Deployment then (docs/kubernetes.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from components.settings.errors import ConfigError
from components.settings.kubernetes import _QUANTITY


class ServeResources(BaseModel):
    """Each serving pod's CPU and memory, requested and limited (Kubernetes quantities)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    cpu: str = Field("1", description="CPU of each serving pod (1, 500m).")
    memory: str = Field("2Gi", description="Memory of each serving pod (2Gi).")

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not _QUANTITY.fullmatch(str(v)):
            raise ValueError("expected a Kubernetes quantity such as 1, 500m or 2Gi")
        return str(v)


class ServeSettings(BaseModel):
    """Whether `ops serve` may deploy the run's model, on how many pods of what size."""

    # The same rules as every other block (schema._Block): camelCase keys, unknown keys refused.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False)

    enabled: bool = Field(False, description="true: `ops serve` deploys tensorflow/serving for the COMPLETE run.")
    replicas: int = Field(1, ge=1, le=20, description="Serving pods (the Deployment's replicas).")
    resources: ServeResources = Field(default_factory=ServeResources, description="Each serving pod's cpu "
                                      "and memory.")


def validate(s: Any) -> None:
    """Refuse serving where there is no cluster to serve on, in one line naming the key."""
    serve = getattr(s, "serve", None)
    if serve is None or not serve.enabled:
        return
    if getattr(s, "scheduler", "groups") != "kubernetes":
        raise ConfigError("serve.enabled", f"true: serving runs on the run's cluster, and scheduler is "
                          f"{s.scheduler}; set scheduler: kubernetes or serve.enabled: false")

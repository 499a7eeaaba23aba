"""The Pulumi program: read the stack's validated settings, build its cloud's training
stack, export the outputs. `ops synth` runs this same file under the SDK's mocks."""

import importlib

import pulumi

from components import settings as config

try:
    settings = config.from_pulumi_config()
except config.ConfigError as e:
    # One line naming the key, before any resource is registered.
    raise pulumi.RunError(str(e)) from None

# components.aws / components.gcp: same class names, imported only for the stack's cloud
# (each provider SDK takes seconds to load).
cloud = importlib.import_module(f"components.{settings.cloud}")
# storage.adopt: import the bucket an earlier `pulumi destroy` kept, instead of creating it.
adopt = settings.storage.adopt
stack = cloud.TrainingStack(
    "trainstack", cloud.TrainingStackArgs(settings=settings, project=pulumi.get_project(), adopt_bucket=adopt)
)
for key, value in stack.exports().items():
    pulumi.export(key, value)

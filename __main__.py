"""The Pulumi program: read the stack's validated settings, build its cloud's training
stack, export the outputs. `ops synth` runs this same file under the SDK's mocks."""

import pulumi

from components import settings as config

try:
    settings = config.from_pulumi_config()
except config.ConfigError as e:
    # One line naming the key, before any resource is registered.
    raise pulumi.RunError(str(e)) from None

if settings.cloud == "gcp":
    raise pulumi.RunError("trainstack:cloud: 'gcp': the GCP training stack is not built yet; use cloud: aws")

from components import aws  # noqa: E402 - imported after validation: pulumi_aws takes seconds to load

stacks = {"aws": (aws.TrainingStack, aws.TrainingStackArgs)}
stack_cls, args_cls = stacks[settings.cloud]
stack = stack_cls("trainstack", args_cls(settings=settings, project=pulumi.get_project()))
for key, value in stack.exports().items():
    pulumi.export(key, value)

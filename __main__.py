"""The Pulumi program: read the stack's validated settings, build its cloud's training
stack, export the outputs. `ops synth` runs this same file under the SDK's mocks."""

import pulumi

from components import multicloud
from components import settings as config

try:
    settings = config.from_pulumi_config()
except config.ConfigError as e:
    # One line naming the key, before any resource is registered.
    raise pulumi.RunError(str(e)) from None

# components.aws / components.gcp: same class names, imported only for the clouds the placements use
# (each provider SDK takes seconds to load); components.multicloud names and builds every placement.
# storage.adopt: import the bucket an earlier `pulumi destroy` kept, instead of creating it.
try:
    stack = multicloud.training_stack("trainstack", settings, project=pulumi.get_project(),
                                      adopt_bucket=settings.storage.adopt)
except config.ConfigError as e:
    # The image's tag that no registry resolves to a digest: one line, before any resource is registered.
    raise pulumi.RunError(str(e)) from None
for key, value in stack.exports().items():
    pulumi.export(key, value)

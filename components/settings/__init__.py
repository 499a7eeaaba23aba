"""The stack's configuration as typed, validated data.

A stack file (`stacks/Pulumi.<stack>.yaml`) holds scalars (`trainstack:cloud`,
`trainstack:region`, `trainstack:project`, `trainstack:scheduler`) and structured blocks (`trainstack:run`,
`trainstack:compute`, `trainstack:image`, `trainstack:storage`, `trainstack:access`,
`trainstack:placement`, `trainstack:kubernetes`) and the list `trainstack:placements`, with
camelCase keys as Pulumi config usually has. Everything is checked here, before the first
resource is created; a bad value raises `ConfigError` whose message is one line naming the
key, the value and what was expected.

One module per job: `schema` (the blocks, their keys and one-block checks), `errors`
(the one-line messages), `aws` / `gcp` (each cloud's `validate()`), `schedulers` (what a managed training job
cannot take), `kubernetes` (the kubernetes block and what a Job on a cluster cannot take), `common` (checks both
clouds share), `placements` (several places of one run), `loading` (stack files and the Pulumi SDK). The secret patterns and the
defaults the policy pack reads are in `components.config_shared`.
"""

from components.config_shared import secret_kind
from components.settings.common import bucket_name_problem
from components.settings.errors import NAMESPACE, NO_SECRETS, ConfigError, known_keys
from components.settings.kubernetes import KubernetesSettings
from components.settings.loading import (
    PLAIN_CREDENTIAL_KEYS,
    from_pulumi_config,
    load_settings,
    load_stack_file,
    raw_from_config,
    raw_from_stack_file,
    read_stack_file,
    stack_name_of,
    validate,
)
from components.settings.schema import (
    BLOCKS,
    BUILTIN_MODELS,
    DEFAULT_IMAGE_REPOSITORY,
    DEFAULT_IMAGE_TAG,
    DEFAULT_WAIT_MINUTES,
    LISTS,
    SCALARS,
    AccessSettings,
    ComputeSettings,
    ImageSettings,
    PlacementPolicySettings,
    PlacementSettings,
    RunSettings,
    Settings,
    StorageSettings,
)
from components.settings.serve import ServeSettings

__all__ = [
    "BLOCKS", "BUILTIN_MODELS", "DEFAULT_IMAGE_REPOSITORY", "DEFAULT_IMAGE_TAG", "DEFAULT_WAIT_MINUTES", "LISTS",
    "NAMESPACE", "NO_SECRETS", "PLAIN_CREDENTIAL_KEYS", "SCALARS", "AccessSettings", "ComputeSettings", "ConfigError",
    "ImageSettings", "KubernetesSettings", "PlacementPolicySettings", "PlacementSettings", "RunSettings", "ServeSettings", "Settings", "StorageSettings",
    "bucket_name_problem", "from_pulumi_config", "known_keys", "load_settings", "load_stack_file", "raw_from_config",
    "raw_from_stack_file", "read_stack_file", "secret_kind", "stack_name_of", "validate",
]

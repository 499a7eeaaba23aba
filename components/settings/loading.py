"""Loading a stack's config: from a stack file or from the Pulumi SDK, checked before anything is created.

Order: no secret anywhere, only known top-level keys, then the schema (`schema.py`), then
the scheduler (`schedulers.py`), the stack's cloud (`aws.validate` / `gcp.validate`) and the rules common to both
(`common.validate`). The first problem raises `ConfigError`, one line naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from components import config_shared
from components.settings import aws, common, gcp, kubernetes, placements, schedulers, serve
from components.settings.errors import NAMESPACE, NO_SECRETS, ConfigError, closest, one_line
from components.settings.schema import BLOCKS, LISTS, SCALARS, Settings

# One validate() per cloud; each raises ConfigError on the first problem.
CLOUD_CHECKS: dict[str, Callable[[Settings], None]] = {"aws": aws.validate, "gcp": gcp.validate}

# Provider keys that hold credentials: in a stack file they must at least be Pulumi secrets.
# A cluster's whole kubeconfig (scheduler kubernetes, kubernetes.kubeconfigSecret): a Pulumi secret or nothing.
KUBECONFIG_KEY = "kubernetes:kubeconfig"
PLAIN_CREDENTIAL_KEYS = ("aws:accessKey", "aws:secretKey", "aws:token", "gcp:credentials", "gcp:accessToken",
                         KUBECONFIG_KEY)


def _walk(value: Any, key: str):
    """(key path, value) for every value under `value`, nested ones included."""
    yield key, value
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{key}[{i}]")


def _is_secure(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"secure"}


def refuse_secrets(raw: Mapping[str, Any]) -> None:
    """No secret anywhere in trainstack's config: neither Pulumi-encrypted nor plain text."""
    for top, block in raw.items():
        for key, v in _walk(block, str(top)):
            if _is_secure(v):
                raise ConfigError(key, "is a secret; " + NO_SECRETS)
            kind = config_shared.secret_kind(v) if isinstance(v, str) else None
            if kind:
                hint = " (give the public key: ssh-keygen -y -f KEY)" if "private key" in kind else ""
                raise ConfigError(key, f"holds {kind}{hint}; " + NO_SECRETS)


def validate(s: Settings) -> None:
    """The checks beyond the schema: the scheduler's, the stack's cloud's, then those common to both clouds."""
    schedulers.validate(s)
    kubernetes.validate(s)
    serve.validate(s)
    CLOUD_CHECKS[s.cloud](s)
    common.validate(s)
    placements.validate(s, CLOUD_CHECKS)


def load_settings(raw: Mapping[str, Any], *, stack: str) -> Settings:
    """Validate a mapping of un-namespaced config keys (cloud, region, run, …)."""
    refuse_secrets(raw)
    known = set(SCALARS) | set(BLOCKS) | set(LISTS)
    for k in raw:
        if k not in known:
            near = closest(k, sorted(known))
            raise ConfigError(k, "unknown key; " + (f"did you mean {NAMESPACE}:{near}?" if near
                                                    else f"expected one of: {', '.join(sorted(known))}"))
    for k in BLOCKS:
        if k in raw and not isinstance(raw[k], Mapping):
            raise ConfigError(k, f"{raw[k]!r}: expected a block of keys")
    for k in LISTS:
        if k in raw and not isinstance(raw[k], list):
            raise ConfigError(k, f"{raw[k]!r}: expected a list of blocks, e.g. [{{cloud: aws, region: us-east-1, "
                              "instanceTypes: [g5.xlarge]}]")
    if "run" not in raw:
        raise ConfigError("run", "is required (at least: synthetic: true or dataUri)")
    raw = placements.merge_home(raw)
    try:
        s = Settings.model_validate({"stack": stack, **raw})
    except ValidationError as err:
        raise one_line(err, Settings) from None
    validate(s)
    return s


def read_stack_file(path: str | Path) -> dict[str, Any]:
    """The whole `config:` mapping of a stack file (every namespace), parsed once."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        start, context = getattr(e, "context_mark", None), getattr(e, "context", None)
        if start is not None and context and mark is not None and start.line != mark.line:
            # An unclosed bracket or quote is found where the file ends: name where it opened too.
            what += f" ({context.removeprefix('while parsing ')} opened at line {start.line + 1})"
        raise ConfigError("config", f"{p.name} is not valid YAML{where}: {what}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError("config", f"{p.name}: expected a mapping with a config: block")
    cfg = doc.get("config") or {}
    if not isinstance(cfg, Mapping):
        raise ConfigError("config", "expected a mapping of config keys")
    return dict(cfg)


def raw_from_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The `trainstack:` keys of a stack file's config mapping, without the namespace.

    Also refuses provider credentials in plain text and a provider region that differs.
    """
    raw = {}
    for k, v in cfg.items():
        ns, _, key = str(k).partition(":")
        if ns == NAMESPACE:
            raw[key] = v
        elif str(k) == KUBECONFIG_KEY and not _is_secure(v):
            raise ConfigError(str(k), "is a credential in plain text; name a context instead "
                              f"(trainstack:kubernetes.context), or `pulumi config set --secret {KUBECONFIG_KEY}`")
        elif str(k) in PLAIN_CREDENTIAL_KEYS and not _is_secure(v):
            raise ConfigError(str(k), "is a credential in plain text; use an AWS profile or gcloud's application "
                              "default credentials, or at least `pulumi config set --secret`")
    refuse_secrets(raw)
    region = cfg.get(f"{raw.get('cloud', 'aws')}:region")
    if region is not None and "region" in raw and region != raw["region"]:
        raise ConfigError(f"{raw.get('cloud', 'aws')}:region", f"{region!r} differs from trainstack:region "
                          f"{raw['region']!r}; remove it (the stack sets its provider's region itself)")
    return raw


def raw_from_stack_file(path: str | Path) -> dict[str, Any]:
    """The `trainstack:` keys of a stack file, without the namespace."""
    return raw_from_config(read_stack_file(path))


def stack_name_of(path: str | Path) -> str:
    """`dev` for `stacks/Pulumi.dev.yaml`."""
    return Path(path).name.removeprefix("Pulumi.").removesuffix(".yaml")


def load_stack_file(path: str | Path, stack: str | None = None) -> Settings:
    """Read and validate `stacks/Pulumi.<stack>.yaml`."""
    return load_settings(raw_from_stack_file(path), stack=stack or stack_name_of(path))


def from_pulumi_config() -> Settings:
    """Read the current stack's config through the Pulumi SDK (used by __main__)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    cfg = pulumi.Config(NAMESPACE)
    raw: dict[str, Any] = {}
    present = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    for full in sorted(present):
        ns, _, key = full.partition(":")
        if ns != NAMESPACE:
            continue
        # `pulumi config set --secret` hands the program the plain value: ask the SDK.
        if runtime_config.is_config_secret(full):
            raise ConfigError(key, "is a secret; " + NO_SECRETS)
        if key not in SCALARS and key not in BLOCKS and key not in LISTS:
            raw[key] = runtime_config.get_config(full)  # refused below, with a did-you-mean
    for k in SCALARS:
        v = cfg.get(k)
        if v is not None and v != "":
            raw[k] = v
    for k in (*BLOCKS, *LISTS):
        v = cfg.get_object(k)
        if v is not None:
            raw[k] = v
    return load_settings(raw, stack=pulumi.get_stack())

"""Every settings model refuses unknown keys, and says which key was meant, in every block.

A block that ignored unknown keys would accept a mistyped `keepOnDestory: false` in silence
and the bucket would go on `pulumi destroy`. The models are found by walking the fields of
`Settings` (nested models, lists and optionals of models included) and every pydantic model
the settings package defines, so a block added later is covered without editing this file.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

import components.settings
from components import settings as st
from components.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEV = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: `M`, `M | None`, `list[M]`, `dict[str, M]`, …"""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def walk(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], type[BaseModel]]]:
    """(key path as a user writes it, model) for `model` and every model under its fields."""
    out = [(path, model)]
    for name, field in model.model_fields.items():
        for sub in _models_in(field.annotation):
            out += walk(sub, (*path, field.alias or name))
    return out


def defined_models() -> set[type[BaseModel]]:
    """Every pydantic model class the settings package's modules define (walked or not)."""
    found = set()
    for info in pkgutil.iter_modules(components.settings.__path__):
        module = importlib.import_module(f"components.settings.{info.name}")
        for _name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseModel) and obj.__module__ == module.__name__:
                found.add(obj)
    return found


WALKED = walk(st.Settings)
BLOCK_PATHS = [path for path, _model in WALKED]


def test_the_walk_finds_every_settings_model():
    walked = {model for _path, model in WALKED}
    # The blocks, the placements' entries and the root at least; any model defined in the package but reached by
    # no field would be a block nobody validates: the walk must see it too.
    assert {st.Settings, st.RunSettings, st.ComputeSettings, st.ImageSettings, st.StorageSettings,
            st.AccessSettings, st.PlacementSettings, st.PlacementPolicySettings} <= walked
    concrete = {m for m in defined_models() if m.model_fields}
    assert concrete <= walked, f"models no settings field reaches: {sorted(m.__name__ for m in concrete - walked)}"
    assert {p[0] for p in BLOCK_PATHS if p} == set(st.BLOCKS) | set(st.LISTS)


@pytest.mark.parametrize(("path", "model"), WALKED, ids=[".".join(p) or "top" for p, _m in WALKED])
def test_every_settings_model_refuses_unknown_keys(path, model):
    """The model itself, without the loader around it: pydantic raises extra_forbidden."""
    assert model.model_config.get("extra") == "forbid", f"{model.__name__} must refuse unknown keys"
    with pytest.raises(ValidationError) as info:
        model.model_validate({"noSuchKey": 1})
    kinds = {(e["type"], e["loc"]) for e in info.value.errors()}
    assert ("extra_forbidden", ("noSuchKey",)) in kinds, kinds


def _typo(key: str) -> str:
    """A mistyping of `key` (its last two letters swapped, as in keepOnDestory)."""
    typo = key[:-2] + key[-1] + key[-2] if len(key) > 2 and key[-1] != key[-2] else key + "x"
    assert typo != key
    return typo


# A list of blocks the dev stack has none of: one valid entry, the typo goes into it.
LIST_ENTRY = {"placements": {"cloud": "aws", "region": DEV["config"]["trainstack:region"],
                             "instanceTypes": DEV["config"]["trainstack:compute"]["instanceTypes"]}}
# A list of blocks inside a block: one valid entry, the typo goes into it.
INNER_LIST_ENTRY = {"allowFindings": {"id": "CVE-2024-3094", "reason": "not reachable in this image", "expires": "2026-01-01"}}


def _at(raw: dict[str, Any], path: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """The mapping at `path` in a raw config, created empty where the dev stack has none (the first entry
    of a list of blocks), and the key path a user reads for it."""
    if path[0] in st.LISTS:
        cur = raw.setdefault(f"trainstack:{path[0]}", [copy.deepcopy(LIST_ENTRY[path[0]])])[0]
        shown = f"{path[0]}[0]"
    else:
        cur = raw.setdefault(f"trainstack:{path[0]}", {})
        shown = path[0]
    for part in path[1:]:
        if part in INNER_LIST_ENTRY:
            cur = cur.setdefault(part, [copy.deepcopy(INNER_LIST_ENTRY[part])])[0]
            shown += f".{part}[0]"
            continue
        cur = cur.setdefault(part, {})
        shown += f".{part}"
    return cur, shown


@pytest.mark.parametrize("path", BLOCK_PATHS, ids=[".".join(p) or "top" for p in BLOCK_PATHS])
def test_a_mistyped_key_is_refused_with_did_you_mean_in_every_block(path):
    """Through the loader a stack file goes through: one line naming the key and the key meant."""
    model = dict(WALKED)[path]
    keys = st.known_keys(model) if path else [*st.SCALARS, *st.BLOCKS, *st.LISTS]
    # The longest key is the one a swapped pair of letters leaves closest to itself.
    meant = max(keys, key=len)
    typo = _typo(meant)
    cfg = copy.deepcopy(DEV["config"])
    shown = ""
    if path:
        block, shown = _at(cfg, path)
        block[typo] = True
    else:
        cfg[f"trainstack:{typo}"] = True
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("trainstack:")}
    with pytest.raises(ConfigError) as info:
        load_settings(raw, stack="dev")
    err = info.value
    assert err.key == ".".join(filter(None, (shown, typo))), str(err)
    hint = f"did you mean trainstack:{meant}?" if not path else f"did you mean {meant!r}?"
    assert hint in str(err), str(err)


def test_the_storage_block_refuses_the_mistyped_keep_on_destroy():
    """The case that matters most: the bucket would be deleted on destroy if this were accepted."""
    cfg = copy.deepcopy(DEV["config"])
    cfg.setdefault("trainstack:storage", {})["keepOnDestory"] = False
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("trainstack:")}
    with pytest.raises(ConfigError) as info:
        load_settings(raw, stack="dev")
    assert str(info.value) == "trainstack:storage.keepOnDestory: unknown key; did you mean 'keepOnDestroy'?"

"""The one-line error of a bad stack config: `ConfigError`, and pydantic's errors said that way.

Every refusal names the key (`trainstack:compute.nodes`), the value and what to write
instead, on one line; pydantic's own wording ("Input should be ...") never reaches a user.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

NAMESPACE = "trainstack"
# What a refused secret's message ends with: trainstack's config holds no secret at all.
NO_SECRETS = ("trainstack needs no secret in its config (the machines get credentials from their role or "
              "service account); remove it, and keep any other tool's secret out of stack files with "
              "`pulumi config set --secret`")


class ConfigError(ValueError):
    """A stack config value that cannot work; `str()` is one line naming the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        # A key of another namespace (aws:secretKey) is shown as it is.
        shown = key if ":" in key.split(".", 1)[0] else f"{NAMESPACE}:{key}"
        super().__init__(f"{shown}: {' '.join(message.split())}")


# A model validator's error names the key it is about: "\x00key\x00message" (see one_line).
_KEYED = "\x00"


def refuse_set(scheduler: str, keys: Iterable[tuple[str, Any, str]]) -> None:
    """Refuse the first of `keys` ((key, value, why) each) that is set, for a stack whose `scheduler` has no
    use for it, naming the key."""
    for key, value, why in keys:
        if value:
            raise ConfigError(key, f"{value!r}: {why} (scheduler {scheduler}); remove it")


def keyed(key: str, message: str) -> ValueError:
    """A model validator's error about one of the block's keys (one_line names that key)."""
    return ValueError(f"{_KEYED}{key}{_KEYED}{message}")


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`M`, `list[M]`, `M | None`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in typing.get_args(annotation) if (m := _model_in(arg)) is not None), None)


def closest(word: str, known: list[str]) -> str | None:
    """The known key `word` most likely mistypes, or None. Of difflib's close matches, one with the same
    letters comes first (two letters swapped: `placemenst` means `placements`, not `placement`)."""
    near = difflib.get_close_matches(word, known, n=3)
    same_letters = [k for k in near if sorted(k) == sorted(word)]
    return (same_letters or near or [None])[0]


def known_keys(model: type[BaseModel]) -> list[str]:
    """The keys a block takes, as a user writes them (camelCase)."""
    return [f.alias or n for n, f in model.model_fields.items()]


def one_line(err: ValidationError, root: type[BaseModel]) -> ConfigError:
    """pydantic's first error on `root` as a ConfigError naming the key, the value and the fix."""
    errors = err.errors(include_url=False)
    # A mistyped key is both unknown and a required key missing: the unknown one says what to fix.
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(e["loc"])
    key = _key_path(loc) or "config"
    value = e.get("input")
    if e["type"] == "extra_forbidden":
        parent = _model_at(root, loc[:-1]) or root
        known = known_keys(parent)
        near = closest(str(loc[-1]), known)
        hint = f"did you mean {near!r}?" if near else f"expected one of: {', '.join(known)}"
        return ConfigError(key, f"unknown key; {hint}")
    msg = e["msg"].removeprefix("Value error, ")
    if msg.startswith(_KEYED):
        sub, _, msg = msg[1:].partition(_KEYED)
        key = f"{key}.{sub}" if loc else sub
        value = value.get(sub.split("[", 1)[0]) if isinstance(value, Mapping) else None
        if value is None or "[" in sub:
            return ConfigError(key, msg)
    if e["type"] == "missing":
        return ConfigError(key, "is required")
    return ConfigError(key, f"{_shown(value)}: {_expected(e, msg)}")


def _shown(value: Any) -> str:
    shown = repr(value) if not isinstance(value, Mapping) else "{…}"
    return shown if len(shown) <= 80 else shown[:77] + "…"


def _expected(e: Mapping[str, Any], msg: str) -> str:
    """pydantic's message said as what to write instead."""
    t, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    if t in ("int_type", "int_parsing", "int_from_float"):
        return "expected a whole number, e.g. 4"
    if t in ("float_type", "float_parsing"):
        return "expected a number, e.g. 1.5"
    if t == "finite_number":
        return "expected a finite number"
    if t in ("bool_type", "bool_parsing"):
        return "expected true or false"
    if t == "string_type":
        if isinstance(value, int | float):
            return "expected text; quote the value in YAML (e.g. '2.21')"
        return "expected text"
    if t == "list_type":
        return "expected a list, e.g. [a, b]"
    if t in ("model_type", "dict_type", "model_attributes_type"):
        return "expected a block of keys"
    if t == "literal_error":
        return f"expected {ctx.get('expected', 'one of the listed values')}".replace("'", "")
    bound = {k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in ctx.items()}
    if t == "greater_than":
        return f"expected a number greater than {bound.get('gt')}"
    if t == "greater_than_equal":
        return f"expected {bound.get('ge')} or more"
    if t == "less_than_equal":
        return f"expected {bound.get('le')} or less"
    if t == "less_than":
        return f"expected less than {bound.get('lt')}"
    if t == "too_short":
        return f"expected at least {ctx.get('min_length')} entr{'y' if ctx.get('min_length') == 1 else 'ies'}; " \
               "remove the key for the default"
    if t == "too_long":
        return f"expected at most {ctx.get('max_length')} entries"
    return msg

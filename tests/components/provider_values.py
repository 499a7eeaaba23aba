"""The provider-value check: every input a stack sets, compared with the values the
provider SDK documents for it.

The mocks accept any value, so a value the real provider refuses (Artifact Registry's
`enablement_config: AUTOMATIC`, when only `INHERITED` or `DISABLED` exist) passed every
test until a real `pulumi up`. The SDKs carry the providers' own lists: input docstrings
say "Possible values are: `A`, `B`." (pulumi_gcp) or "Valid values are `a`, `b`."
(pulumi_aws), and some inputs are typed with an Enum (pulumi_docker_build's Platform,
pulumi_aws's enums). This module walks a resource's inputs through the SDK's input
types, nested ones included, and reports each value outside its documented list, and each
number outside its documented range ("must be a positive integer", "in between A and B",
a 0 the provider ignores).

It relies on `pulumi._types.input_type_py_to_pulumi_names` (pulumi 3.x) to map the wire
names back to the SDK's property names.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import keyword
import re
from dataclasses import dataclass
from typing import Any

from pulumi import _types as pulumi_types

SDKS = {"aws": "pulumi_aws", "gcp": "pulumi_gcp", "docker-build": "pulumi_docker_build"}

# The phrasings of a closed list in the SDKs' docstrings: "Possible values are: `A`, `B`."
# and "Valid options are: `YES`, `NO`." (pulumi_gcp), "Valid values: `a`, `b`, and `c`.", "Can be `stop` or `terminate`.",
# "Must be one of: ...", "One of: `OFF`, `FLEXIBLE`." (pulumi_aws's scheduler), "accepts the value `A`, `B`, or `C`", 'Acceptable values are
# "inherited" or "enforced"'. Open phrasings ("such as", "for example") are not lists.
_PHRASE = (
    r"(?:(?:Possible|Valid|Allowed|Accepted|Acceptable|Supported) (?:values|options)(?: are| include)?"
    r"|Can be(?: one of)?|Must be(?: one of)?|accepts the values?|(?-i:One of:))"
)
_VALUE = r'(?:`"?[^`"]+"?`|"[^"]+")'
_SEP = r"(?:\s*,\s*(?:and|or)\s+|\s*,\s*|\s+(?:and|or)\s+)"
_LIST = re.compile(rf"{_PHRASE}\s*:?\s*({_VALUE}(?:{_SEP}{_VALUE})*)", re.IGNORECASE)
_TICKED = re.compile(r'`"?([^`"]+)"?`|"([^"]+)"')
_REF = re.compile(r"ForwardRef\('([A-Za-z_][A-Za-z0-9_]*)'\)")


# Numbers: "Must be a positive integer." / "must be a non-zero positive integer" (pulumi_aws),
# "The value must be in between 604800(7 days) and 7776000(90 days). ... must be set to 0." and
# "When set to `0` it will be ignored" (pulumi_gcp: the provider drops a 0, a rule loses that condition).
_POSITIVE = re.compile(r"must be a (?:non-zero )?positive integer", re.IGNORECASE)
# and pulumi_aws's "Valid values between 60 and 21600." (Lambda's event invoke config), "Ranges from `0` to `185`"
# (the scheduler's retry policy).
_BETWEEN = re.compile(r"(?:must be in between|Valid values between|Ranges from) `?(\d+)`?(?:\s*\([^)]*\))?\s+(?:and|to)\s+`?(\d+)",
                      re.IGNORECASE)
_ALSO = re.compile(r"must be set to `?(\d+)`?", re.IGNORECASE)
_ZERO_IGNORED = re.compile(r"set to `0` it will be ignored|`0` value of `\w+` field will be ignored", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    """One input value the provider does not document as allowed."""

    resource: str
    path: str
    value: Any
    allowed: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.resource}: {self.path} = {self.value!r}; the provider allows only {', '.join(self.allowed)}"


def documented_values(doc: str | None) -> tuple[str, ...] | None:
    """The closed list of values a property's docstring names, or None when it names none."""
    if not doc:
        return None
    m = _LIST.search(" ".join(doc.split()))
    if not m:
        return None
    return tuple(a or b for a, b in _TICKED.findall(m.group(1)))


def documented_number_problem(doc: str | None, value: int) -> str | None:
    """What a property's docstring says is wrong with the number `value`, or None when nothing is."""
    if not doc:
        return None
    text = " ".join(doc.split())
    if value == 0 and _ZERO_IGNORED.search(text):
        return "0 is ignored by the provider (the condition is dropped)"
    between = _BETWEEN.search(text)
    if between:
        lo, hi = int(between.group(1)), int(between.group(2))
        also = {int(v) for v in _ALSO.findall(text)}
        if not (lo <= value <= hi or value in also):
            return f"between {lo} and {hi}" + (f" or {', '.join(map(str, sorted(also)))}" if also else "")
    if _POSITIVE.search(text) and value < 1:
        return "a positive integer"
    return None


def resource_args_class(type_token: str) -> tuple[type, Any] | None:
    """(the SDK's `<Resource>Args` input type, its module) for a type token, or None for
    components and providers we do not check."""
    package, _, rest = type_token.partition(":")
    if package not in SDKS:
        return None
    module_path, _, name = rest.partition(":")
    module_name = module_path.split("/")[0]
    # A module named by a Python keyword takes a trailing underscore in the SDK (aws:lambda -> pulumi_aws.lambda_).
    module_name = module_name + "_" if keyword.iskeyword(module_name) else module_name
    module = importlib.import_module(SDKS[package] if module_name == "index" else f"{SDKS[package]}.{module_name}")
    args = getattr(module, f"{name}Args", None)
    if args is None:
        raise LookupError(f"{type_token}: no {name}Args in {module.__name__}; the check cannot read its inputs")
    return args, module


def _property_types(prop: property, module: Any) -> tuple[list[type], list[type[enum.Enum]], bool]:
    """The nested input types, the enums and whether a plain str is also accepted, from a
    property's (forward-referenced) return annotation."""
    text = repr(inspect.signature(prop.fget).return_annotation)
    nested, enums = [], []
    for ref in dict.fromkeys(_REF.findall(text)):  # each name once, in order
        found = getattr(module, ref, None)
        if found is None:
            inputs = getattr(module, "_inputs", None)
            found = getattr(inputs, ref, None) if inputs else None
        if isinstance(found, type) and issubclass(found, enum.Enum):
            enums.append(found)
        elif isinstance(found, type) and hasattr(found, "__init__") and ref.endswith("Args"):
            nested.append(found)
    return nested, enums, "<class 'str'>" in text


def check_inputs(resource: str, inputs: dict, args_cls: type, module: Any, path: str = "") -> list[Problem]:
    """Every documented-list violation in `inputs` (wire names) for the input type `args_cls`."""
    problems: list[Problem] = []
    names = {wire: py for py, wire in pulumi_types.input_type_py_to_pulumi_names(args_cls).items()}
    for wire, value in inputs.items():
        py = names.get(wire)
        prop = args_cls.__dict__.get(py) if py else None
        if not isinstance(prop, property):
            continue  # not an SDK input (e.g. a key the mocks add): nothing documented to compare
        where = f"{path}{wire}"
        nested, enums, takes_str = _property_types(prop, module)
        allowed = documented_values(prop.__doc__)
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            at = f"{where}[{i}]" if isinstance(value, list) else where
            if isinstance(v, dict) and nested:
                problems += check_inputs(resource, v, nested[0], module, f"{at}.")
            elif isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer():
                wrong = documented_number_problem(prop.__doc__, int(v))
                if wrong:
                    problems.append(Problem(resource, at, v, (wrong,)))
            elif isinstance(v, str):
                if allowed is not None and v not in allowed:
                    problems.append(Problem(resource, at, v, allowed))
                for e in enums:
                    # Union[str, Enum]: the enum lists the known values, the str lets newer ones through.
                    if not takes_str and v not in {m.value for m in e}:
                        problems.append(Problem(resource, at, v, tuple(str(m.value) for m in e)))
    return problems


def check_resource(record: dict) -> list[Problem]:
    """The problems of one `ops synth` resource record ({"type", "name", "inputs", ...})."""
    found = resource_args_class(record["type"])
    if found is None:
        return []
    args_cls, module = found
    return check_inputs(f"{record['type']} {record['name']}", record["inputs"], args_cls, module)


def checked_inputs(record: dict) -> int:
    """How many of a record's input paths carry a documented list or enum (proves the walk reached them)."""
    found = resource_args_class(record["type"])
    if found is None:
        return 0
    args_cls, module = found
    return _count(record["inputs"], args_cls, module)


def _count(inputs: dict, args_cls: type, module: Any) -> int:
    names = {wire: py for py, wire in pulumi_types.input_type_py_to_pulumi_names(args_cls).items()}
    n = 0
    for wire, value in inputs.items():
        prop = args_cls.__dict__.get(names.get(wire, ""))
        if not isinstance(prop, property):
            continue
        nested, enums, takes_str = _property_types(prop, module)
        if documented_values(prop.__doc__) is not None or (enums and not takes_str):
            n += 1
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, dict) and nested:
                n += _count(v, nested[0], module)
    return n

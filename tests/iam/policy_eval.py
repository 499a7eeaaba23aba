"""A small IAM policy evaluator for the tests: identity policies, one request at a time.

moto_server enforces IAM only in part (see tests/fixtures/iam_cloud.py): it ignores the
conditions of identity policies and checks some services against the resource "*". The
authorization layer in front of it asks this module instead, with the request's action,
resource ARN and condition keys, following AWS's documented evaluation logic for one
account and identity policies only (no resource policies, boundaries or SCPs: the stack
uses none):

- an explicit Deny in any statement that applies wins; else an Allow that applies allows;
  else the request is implicitly denied;
- `Action`/`NotAction` match case-insensitively, `Resource`/`NotResource` case-sensitively,
  with `*` (any run of characters, `/` included) and `?` (one character);
- within `Condition`, every operator must hold, and within an operator every key; a key
  with several values holds when the request's value matches any of them (for negated
  operators: none of them);
- a key missing from the request makes a positive operator false and a negated one true;
  `...IfExists` makes a missing key true;
- an operator this module does not know raises `UnsupportedPolicy`, so a policy that
  starts using one fails the tests instead of being half-evaluated.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class UnsupportedPolicy(ValueError):
    """The policy uses an element or operator this evaluator does not implement."""


class Decision(enum.Enum):
    """The outcome of evaluating a request."""

    ALLOW = "allow"
    IMPLICIT_DENY = "implicit-deny"
    EXPLICIT_DENY = "explicit-deny"


@dataclass(frozen=True)
class Request:
    """One action on one resource, with the condition keys the request carries."""

    action: str
    resource: str
    context: Mapping[str, str | list[str]] = field(default_factory=dict)


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    # IAM wildcards: '*' any run (across '/' and ':'), '?' one character; nothing else is special.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def wildcard_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """Whether `value` matches the IAM wildcard `pattern` (`*` and `?`)."""
    return bool(_wildcard(pattern, ignore_case=ignore_case).match(value))


def _as_list(value: object) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _number(value: object) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


def _string_like(cond: str, actual: str) -> bool:
    return wildcard_match(cond, actual)


_POSITIVE = {
    "StringEquals": lambda c, a: str(c) == a,
    "StringEqualsIgnoreCase": lambda c, a: str(c).lower() == a.lower(),
    "StringLike": lambda c, a: _string_like(str(c), a),
    "NumericEquals": lambda c, a: _number(c) is not None and _number(c) == _number(a),
    "NumericLessThan": lambda c, a: None not in (_number(c), _number(a)) and _number(a) < _number(c),
    "NumericLessThanEquals": lambda c, a: None not in (_number(c), _number(a)) and _number(a) <= _number(c),
    "NumericGreaterThan": lambda c, a: None not in (_number(c), _number(a)) and _number(a) > _number(c),
    "NumericGreaterThanEquals": lambda c, a: None not in (_number(c), _number(a)) and _number(a) >= _number(c),
    "Bool": lambda c, a: str(c).lower() == a.lower(),
    "ArnEquals": lambda c, a: str(c) == a,
    "ArnLike": lambda c, a: _string_like(str(c), a),
}
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "NumericNotEquals": "NumericEquals",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


def _lookup(context: Mapping[str, str | list[str]], key: str) -> list[str] | None:
    # Condition key names are case-insensitive in IAM.
    for k, v in context.items():
        if k.lower() == key.lower():
            return [str(x) for x in _as_list(v)]
    return None


def condition_holds(operator: str, key: str, expected: object, context: Mapping[str, str | list[str]]) -> bool:
    """Whether one operator/key pair of a Condition block holds for the request's context."""
    if operator.startswith(("ForAnyValue:", "ForAllValues:")):
        raise UnsupportedPolicy(f"set operator {operator} is not implemented by the test evaluator")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    actual = _lookup(context, key)
    if actual is None:
        return if_exists or base in _NEGATED
    wanted = _as_list(expected)
    if base in _NEGATED:
        test = _POSITIVE[_NEGATED[base]]
        return not any(test(c, a) for c in wanted for a in actual)
    if base in _POSITIVE:
        test = _POSITIVE[base]
        return any(test(c, a) for c in wanted for a in actual)
    raise UnsupportedPolicy(f"condition operator {operator} is not implemented by the test evaluator")


def _statement_applies(statement: Mapping, request: Request) -> bool:
    if "Principal" in statement or "NotPrincipal" in statement:
        raise UnsupportedPolicy("identity policies have no Principal; this evaluator takes identity policies only")
    if "Action" in statement:
        if not any(wildcard_match(p, request.action, ignore_case=True) for p in _as_list(statement["Action"])):
            return False
    elif "NotAction" in statement:
        if any(wildcard_match(p, request.action, ignore_case=True) for p in _as_list(statement["NotAction"])):
            return False
    else:
        raise UnsupportedPolicy("a statement needs Action or NotAction")
    if "Resource" in statement:
        if not any(wildcard_match(p, request.resource) for p in _as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement:
        if any(wildcard_match(p, request.resource) for p in _as_list(statement["NotResource"])):
            return False
    else:
        raise UnsupportedPolicy("an identity policy statement needs Resource or NotResource")
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, expected in keys.items():
            if not condition_holds(operator, key, expected, request.context):
                return False
    return True


def statements(documents: Iterable[str | Mapping]) -> list[Mapping]:
    """Every statement of the given policy documents (JSON text or parsed)."""
    out: list[Mapping] = []
    for doc in documents:
        parsed = json.loads(doc) if isinstance(doc, str) else doc
        out += _as_list(parsed["Statement"])
    return out


def evaluate(documents: Iterable[str | Mapping], request: Request) -> Decision:
    """The decision of AWS's identity-policy evaluation for `request` under `documents`."""
    allowed = False
    for statement in statements(documents):
        effect = statement.get("Effect")
        if effect not in ("Allow", "Deny"):
            raise UnsupportedPolicy(f"Effect must be Allow or Deny, got {effect!r}")
        if _statement_applies(statement, request):
            if effect == "Deny":
                return Decision.EXPLICIT_DENY
            allowed = True
    return Decision.ALLOW if allowed else Decision.IMPLICIT_DENY




def evaluate_trust(document: str | Mapping, *, action: str, context: Mapping[str, str | list[str]],
                   federated: str | None = None, service: str | None = None) -> Decision:
    """The decision of a role's trust policy for a federated caller (`Principal: {Federated: ...}`) or an AWS
    service acting for a resource (`Principal: {Service: ...}`, e.g. SageMaker for a training job): a
    statement applies when its principal names the caller, its action matches and its conditions hold for
    `context` (a token's claims as the provider's condition keys; for a service, `aws:SourceAccount` and
    `aws:SourceArn` of the resource it acts for). Give `federated` or `service`; no other principal kind is
    evaluated: a statement naming one raises UnsupportedPolicy."""
    if (federated is None) == (service is None):
        raise ValueError("give one of federated or service")
    kind, caller = ("Federated", federated) if federated is not None else ("Service", service)
    allowed = False
    for statement in statements([document]):
        principal = statement.get("Principal")
        if not isinstance(principal, Mapping) or set(principal) != {kind} or "NotPrincipal" in statement:
            raise UnsupportedPolicy(f"trust principal {principal!r}: only {kind} is evaluated here")
        if caller not in _as_list(principal[kind]):
            continue
        if not any(wildcard_match(p, action, ignore_case=True) for p in _as_list(statement.get("Action", []))):
            continue
        holds = all(condition_holds(op, key, expected, context)
                    for op, keys in (statement.get("Condition") or {}).items() for key, expected in keys.items())
        if not holds:
            continue
        if statement.get("Effect") == "Deny":
            return Decision.EXPLICIT_DENY
        allowed = True
    return Decision.ALLOW if allowed else Decision.IMPLICIT_DENY


def google_token_context(claims: Mapping[str, object]) -> dict[str, str]:
    """The condition keys AWS sets from a Google ID token's claims (IAM's keys for web identity federation):
    `accounts.google.com:aud` is the `azp` claim when there is one (else `aud`), `:oaud` the `aud` claim,
    `:sub` the `sub` claim."""
    context = {"accounts.google.com:oaud": str(claims.get("aud", "")), "accounts.google.com:sub": str(claims.get("sub", ""))}
    context["accounts.google.com:aud"] = str(claims.get("azp") or claims.get("aud", ""))
    return context


def _names(principal: object, caller: str, account: str) -> tuple[bool, bool]:
    """(whether a key policy's `Principal` names `caller` itself, whether it names `caller`'s account root)."""
    if principal == "*":
        raise UnsupportedPolicy("a key policy Principal of '*' is not evaluated here")
    if not isinstance(principal, Mapping) or set(principal) != {"AWS"}:
        raise UnsupportedPolicy(f"key policy principal {principal!r}: only AWS principals are evaluated here")
    named = [str(p) for p in _as_list(principal["AWS"])]
    root = f"arn:aws:iam::{account}:root"
    return caller in named, root in named or account in named


def evaluate_key_policy(key_policy: str | Mapping, identity_policies: Iterable[str | Mapping], *, caller: str,
                        request: Request) -> Decision:
    """The decision for a KMS request by `caller` (a role's or user's ARN in the key's account; a session of a role
    is its role) under the key's policy and the caller's own identity policies, as AWS KMS documents it: an explicit
    Deny in either wins; a key policy statement naming the caller allows by itself; one naming the account root
    lets the caller's identity policies allow (and only then); anything else is an implicit deny. One account only:
    no grants, no cross-account principals, no `*` principal."""
    account = caller.split(":")[4]
    by_key, through_iam = False, False
    for statement in statements([key_policy]):
        if "NotPrincipal" in statement:
            raise UnsupportedPolicy("NotPrincipal is not evaluated here")
        itself, root = _names(statement.get("Principal"), caller, account)
        if not (itself or root):
            continue
        bare = {k: v for k, v in statement.items() if k != "Principal"}
        if not _statement_applies(bare, request):
            continue
        if statement.get("Effect") == "Deny":
            return Decision.EXPLICIT_DENY
        by_key = by_key or itself
        through_iam = through_iam or root
    identity = evaluate(identity_policies, request)
    if identity is Decision.EXPLICIT_DENY:
        return Decision.EXPLICIT_DENY
    if by_key or (through_iam and identity is Decision.ALLOW):
        return Decision.ALLOW
    return Decision.IMPLICIT_DENY

"""The AWS policy documents a stack produces, found in its resources, and their lint by parliament.

One place knows where documents live (role trust and inline policies, managed and role
policies, bucket and repository policies), so the wildcard rule in `policy.rules` and the
parliament lint read the same documents. Only the lint needs parliament; the rest is
stdlib so the policy pack's own virtualenv can import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# type -> (input holding a document, kind). "trust" documents say who may assume a role,
# "identity" ones what a role may do, "resource" ones who may touch a bucket or repository, "key" who may
# administer or use a KMS key (its key policy).
DOCUMENT_INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "aws:iam/role:Role": (("assumeRolePolicy", "trust"),),
    "aws:iam/policy:Policy": (("policy", "identity"),),
    "aws:iam/rolePolicy:RolePolicy": (("policy", "identity"),),
    "aws:iam/userPolicy:UserPolicy": (("policy", "identity"),),
    "aws:iam/groupPolicy:GroupPolicy": (("policy", "identity"),),
    "aws:s3/bucketPolicy:BucketPolicy": (("policy", "resource"),),
    "aws:s3/bucket:Bucket": (("policy", "resource"),),
    "aws:s3/bucketV2:BucketV2": (("policy", "resource"),),
    "aws:ecr/repositoryPolicy:RepositoryPolicy": (("policy", "resource"),),
    "aws:kms/key:Key": (("policy", "key"),),
}

# What parliament reports for every trust policy by design: a trust policy names a
# Principal and has no Resource, which parliament's identity-policy checks call malformed.
TRUST_POLICY_FINDINGS = (("MALFORMED", "neither Resource nor NotResource"),)
# And for every key policy: its Resource must be "*", which in a key policy means the key itself (AWS KMS's
# key policy documentation); parliament reads it as every resource.
KEY_POLICY_FINDINGS = ("RESOURCE_STAR",)


@dataclass(frozen=True)
class PolicyDocument:
    """One policy document: the resource that holds it, where, what kind, and its text."""

    resource: str
    field: str
    kind: str
    text: str

    def parsed(self) -> dict[str, Any]:
        """The document as data; raises ValueError when it is not a JSON object."""
        doc = json.loads(self.text)
        if not isinstance(doc, dict):
            raise ValueError("a policy document must be a JSON object")
        return doc


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return json.dumps(value)
    return None


def policy_documents(resources: Iterable[Mapping[str, Any]]) -> list[PolicyDocument]:
    """Every AWS policy document held by `resources` (inline role policies included)."""
    out: list[PolicyDocument] = []
    for r in resources:
        inputs = r.get("inputs") or {}
        for field, kind in DOCUMENT_INPUTS.get(r.get("type", ""), ()):
            text = _as_text(inputs.get(field))
            if text:
                out.append(PolicyDocument(r["name"], field, kind, text))
        if r.get("type") == "aws:iam/role:Role":
            for i, inline in enumerate(inputs.get("inlinePolicies") or []):
                text = _as_text((inline or {}).get("policy"))
                if text:
                    out.append(PolicyDocument(r["name"], f"inlinePolicies[{i}].policy", "identity", text))
    return out


def statements(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The document's statements as a list (IAM allows a single statement object)."""
    st = doc.get("Statement") or []
    return [st] if isinstance(st, Mapping) else [s for s in st if isinstance(s, Mapping)]


def as_list(value: Any) -> list[Any]:
    """IAM fields hold a string or a list of strings; always give a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


@dataclass(frozen=True)
class LintFinding:
    """One parliament finding on one document."""

    resource: str
    field: str
    issue: str
    detail: str

    def __str__(self) -> str:
        return f"{self.resource}.{self.field}: {self.issue}: {self.detail}"


def lint(docs: Iterable[PolicyDocument]) -> list[LintFinding]:
    """parliament's findings on each document, less those every trust policy has by design."""
    from parliament import analyze_policy_string  # deferred: only the lint needs it

    out: list[LintFinding] = []
    for d in docs:
        for f in analyze_policy_string(d.text).findings:
            if d.kind == "trust" and any(f.issue == i and s in str(f.detail) for i, s in TRUST_POLICY_FINDINGS):
                continue
            if d.kind == "key" and f.issue in KEY_POLICY_FINDINGS:
                continue
            out.append(LintFinding(d.resource, d.field, f.issue, str(f.detail)))
    return out

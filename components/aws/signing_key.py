"""SigningKey (AWS): the stack's asymmetric KMS key that signs the images it builds (components/image_signature.py).

An ECDSA P-256 key (`ECC_NIST_P256`, `SIGN_VERIFY`) in home's region: its private half never leaves KMS. Who may
do what with it is said by its key policy alone (`key_policy`):

- the identity that runs `pulumi up` (the role of an assumed-role session, or the user; `signer_arn`) may `Sign`
  and read the public key: ImageSignature signs as it, at `pulumi up`;
- the account's IAM principals may administer the key (describe, tag, change its policy, schedule its deletion)
  when their own IAM policies say so, but use it for nothing: the account root is not given `Sign`, so no
  identity policy can grant it;
- the machines' role gets nothing on the key, not even `GetPublicKey`: a machine verifies with the public key in
  its user data (`TRAINSTACK_IMAGE_PUBLIC_KEY`), which it neither needs to ask for nor could be handed a
  different one of by a compromised KMS call.

A destroyed key waits `DELETION_WINDOW_DAYS` before KMS deletes it (an accidental destroy can be undone); the
images it signed stay verifiable by machines that hold its public key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

KEY_SPEC = "ECC_NIST_P256"
KEY_USAGE = "SIGN_VERIFY"
# AWS's longest: 7 to 30 days.
DELETION_WINDOW_DAYS = 30
# What the signer does: sign (ImageSignature's `Sign`), and read the public key it hands the user data.
SIGNER_ACTIONS = ("kms:GetPublicKey", "kms:Sign")
# AWS's documented key-administrator actions, listed one by one: none uses the key (Sign, Verify).
ADMIN_ACTIONS = (
    "kms:CancelKeyDeletion", "kms:CreateAlias", "kms:DeleteAlias", "kms:DescribeKey", "kms:DisableKey",
    "kms:EnableKey", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:GetPublicKey", "kms:ListAliases",
    "kms:ListResourceTags", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource",
    "kms:UpdateAlias", "kms:UpdateKeyDescription",
)


def key_policy(*, partition: str, account_id: str, signer_arn: str) -> str:
    """The key policy: the account's IAM administers the key, `signer_arn` alone signs with it (module docstring)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministersTheKey", "Effect": "Allow",
             "Principal": {"AWS": f"arn:{partition}:iam::{account_id}:root"},
             "Action": list(ADMIN_ACTIONS), "Resource": "*"},
            {"Sid": "TheDeployerSignsImages", "Effect": "Allow", "Principal": {"AWS": signer_arn},
             "Action": list(SIGNER_ACTIONS), "Resource": "*"},
        ],
    }, sort_keys=True)


@dataclass(kw_only=True)
class SigningKeyArgs:
    """Inputs of a SigningKey."""

    region: str
    """Home's region: the key lives there (ImageSignature calls KMS there)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the key."""


class SigningKey(pulumi.ComponentResource):
    """An ECDSA P-256 KMS key that the deployer alone may sign with."""

    key: aws.kms.Key
    key_id: pulumi.Output[str]
    """What ImageSignature signs with: the key's ARN."""
    region: str
    """The key's region."""
    signer_arn: pulumi.Output[str]
    """The identity the key policy lets sign: the deployer's role (or user)."""
    ready: list[pulumi.Resource]
    """What must exist before anything signs with the key (the key, whose policy grants the signer)."""

    def __init__(self, name: str, args: SigningKeyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:SigningKey", name, None, opts)
        invoke = pulumi.InvokeOptions(parent=self)
        caller = aws.get_caller_identity_output(opts=invoke)
        partition = aws.get_partition_output(opts=invoke).partition
        # An assumed role's session ARN names the session, which changes from one `pulumi up` to the next (and a
        # key policy cannot name it stably): the role it is a session of signs. A user's ARN is its own.
        self.signer_arn = aws.iam.get_session_context_output(arn=caller.arn, opts=invoke).issuer_arn
        self.region = args.region
        self.key = aws.kms.Key(
            f"{name}-key",
            description="trainstack: signs the images this stack builds (cosign-compatible signatures)",
            customer_master_key_spec=KEY_SPEC,
            key_usage=KEY_USAGE,
            deletion_window_in_days=DELETION_WINDOW_DAYS,
            policy=pulumi.Output.all(partition, caller.account_id, self.signer_arn).apply(
                lambda v: key_policy(partition=v[0], account_id=v[1], signer_arn=v[2])),
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.key_id = self.key.arn
        self.ready = [self.key]
        self.register_outputs({"key_id": self.key_id, "signer_arn": self.signer_arn})

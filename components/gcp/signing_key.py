"""SigningKey (GCP): the stack's asymmetric Cloud KMS key that signs the images it builds
(components/image_signature.py).

A key ring in home's region holding one crypto key (`ASYMMETRIC_SIGN`, `EC_SIGN_P256_SHA256`, software-protected)
and its one version, made explicitly so its name is known: ImageSignature signs with that version. Who may use it
is said on the key itself:

- the identity that runs `pulumi up` (the provider's account, `user:` or `serviceAccount:`) gets
  `roles/cloudkms.signer` (`cryptoKeyVersions.useToSign`) and `roles/cloudkms.publicKeyViewer`
  (`viewPublicKey`): ImageSignature signs as it, and reads the public key it hands the user data. No basic role
  (Owner, Editor) carries a Cloud KMS cryptographic operation, so this grant is needed, and is the only one;
- the machines' service account gets nothing on the key: a machine verifies with the public key in its user data
  (`TRAINSTACK_IMAGE_PUBLIC_KEY`), and asks Cloud KMS nothing.

Key rings and crypto keys cannot be deleted in Cloud KMS, so their names stay taken after `pulumi destroy` (which
schedules the version's destruction and forgets the rest): the key ring's name ends in a RandomId kept in the
stack's state, the same on every `up`, new after a `destroy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from components.gcp.naming import key_ring_name

PURPOSE = "ASYMMETRIC_SIGN"
ALGORITHM = "EC_SIGN_P256_SHA256"
PROTECTION_LEVEL = "SOFTWARE"
KEY_NAME = "image-signing"
# What the deployer needs on the key, and no more: sign, and read the public key.
SIGNER_ROLES = ("roles/cloudkms.signer", "roles/cloudkms.publicKeyViewer")
KEY_RING_SUFFIX_BYTES = 4


def member(email: str) -> str:
    """The IAM member of the account the provider authenticates as: a service account's email ends in
    `.gserviceaccount.com`; any other is a user's."""
    return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"


@dataclass(kw_only=True)
class SigningKeyArgs:
    """Inputs of a SigningKey."""

    gcp_project: str
    """The stack's (home's) GCP project."""
    region: str
    """Home's region: the key ring lives there."""
    name_prefix: str
    """What the key ring's name starts with (`naming.key_ring_name` adds the random suffix)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels for the crypto key (key rings take none)."""


class SigningKey(pulumi.ComponentResource):
    """An EC P-256 Cloud KMS key that the deployer alone may sign with."""

    key_ring: gcp.kms.KeyRing
    crypto_key: gcp.kms.CryptoKey
    version: gcp.kms.CryptoKeyVersion
    key_id: pulumi.Output[str]
    """What ImageSignature signs with: the crypto key version's name."""
    region: str
    """The key ring's region."""
    signer: pulumi.Output[str]
    """The IAM member the key lets sign: the deployer."""
    grants: list[gcp.kms.CryptoKeyIAMMember]
    ready: list[pulumi.Resource]
    """What must exist before anything signs with the key: its version, and the deployer's grants on it."""

    def __init__(self, name: str, args: SigningKeyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:SigningKey", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.region = args.region
        suffix = random.RandomId(f"{name}-suffix", byte_length=KEY_RING_SUFFIX_BYTES, opts=child)
        self.key_ring = gcp.kms.KeyRing(
            f"{name}-ring",
            name=suffix.hex.apply(lambda h: key_ring_name(args.name_prefix, h)),
            location=args.region,
            project=args.gcp_project,
            opts=child,
        )
        self.crypto_key = gcp.kms.CryptoKey(
            f"{name}-key",
            name=KEY_NAME,
            key_ring=self.key_ring.id,
            purpose=PURPOSE,
            version_template=gcp.kms.CryptoKeyVersionTemplateArgs(algorithm=ALGORITHM,
                                                                  protection_level=PROTECTION_LEVEL),
            # Its one version is made below, where its name can be read.
            skip_initial_version_creation=True,
            labels=args.labels,
            opts=child,
        )
        self.version = gcp.kms.CryptoKeyVersion(f"{name}-version", crypto_key=self.crypto_key.id, opts=child)
        self.key_id = self.version.name
        email = gcp.organizations.get_client_open_id_user_info_output(opts=pulumi.InvokeOptions(parent=self)).email
        self.signer = email.apply(member)
        self.grants = [gcp.kms.CryptoKeyIAMMember(f"{name}-{role.rsplit('.', 1)[1].lower()}",
                                                  crypto_key_id=self.crypto_key.id, role=role, member=self.signer,
                                                  opts=child) for role in SIGNER_ROLES]
        self.ready = [self.version, *self.grants]
        self.register_outputs({"key_id": self.key_id, "signer": self.signer})

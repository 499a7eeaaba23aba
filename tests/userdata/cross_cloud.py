"""An AWS-home stack with a GCP placement on the emulators, for the sandbox tests of a GCE machine
reaching the S3 home with its Google identity (test_cross_cloud_boot.py, test_cross_cloud_move.py).

:func:`aws_home` synthesizes the stack (`ops synth`) and builds what `pulumi up` would have made on
the IAM-enforcing moto_server (tests/fixtures/iam_cloud.py), from the synth output's own documents:
the home bucket with the trainer's code archive in it, and the GCP placement's machine role
(its trust policy and its policy, registered with the authorization layer, which decides
`AssumeRoleWithWebIdentity` on the token's claims). :func:`gce_machine` is a sandbox machine of
that placement: GCE's metadata server serving its service account's ID token, the env file's
store variables for S3 through federation, and no AWS key anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from components import placement
from components.aws.federation import audience
from components.code import archive_key, boot_key, pack, pack_boot_scripts
from components.settings import load_settings
from components.userdata import aws_store_env
from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox
from devtools.servers import Run
from ops import synth
from ops.fakes.common import fake_hex
from tests.fixtures.iam_cloud import IamCloud

REGION = "us-east-1"
GCP_PROJECT = "my-gpus-42"
STACK = "places"
STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def raw_stack(*, steps: int, every: int, batch: int, seed: int) -> dict:
    """An AWS-home stack (us-east-1) with a GCP placement (us-central1): the mlp on synthetic data."""
    return {
        "cloud": "aws", "region": REGION,
        "run": {"id": "exp-7", "model": "mlp", "synthetic": True, "steps": steps, "batchSize": batch, "seed": seed,
                "checkpointEverySteps": every, "checkpointEverySeconds": 600, "extraArgs": ["--deterministic"]},
        "compute": {"maxRuntimeHours": 1},
        "placements": [{"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
                       {"cloud": "gcp", "region": "us-central1", "project": GCP_PROJECT,
                        "instanceTypes": ["g2-standard-4"]}],
    }


@dataclass
class AwsHome:
    """The synthesized stack and what exists of it on the IAM-enforcing moto_server."""

    raw: dict
    settings: object  # components.settings.Settings
    synth: synth.Result
    bucket: str
    run_uri: str
    run_prefix: str  # the run folder's key prefix in the bucket, "runs/<id>/"
    code_uri: str
    boot_uri: str  # the boot scripts' archive, as `pulumi up` uploads it
    home_group: str  # placement 0's Auto Scaling group (not created here)
    gcp_group: str  # placement 1's managed instance group
    machine_role: str  # the ARN of the GCP placement's machines' role
    unique_id: str  # the GCP placement's service account's unique id, the one the role trusts

    def admin_env(self, cloud: IamCloud, endpoint: str | None = None) -> dict[str, str]:
        """The admin's variables (set-up and checks), through `endpoint` (default: the authorization layer)."""
        return {"AWS_ENDPOINT_URL": endpoint or cloud.proxy.url, "AWS_DEFAULT_REGION": REGION,
                "AWS_ACCESS_KEY_ID": cloud.proxy.admin[0], "AWS_SECRET_ACCESS_KEY": cloud.proxy.admin[1]}


def aws_home(cloud: IamCloud, raw: dict) -> AwsHome:
    """`raw` synthesized, its bucket, code archive and GCP placement's machine role made on `cloud`."""
    settings = load_settings(raw, stack=STACK)
    r = synth.synthesize(raw, stack=STACK)
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-federation-p1"]
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-federation-p1"]
    unique_id = str(int(fake_hex("gcp:serviceaccount/account:Account", "trainstack-identity-p1-sa")[:15], 16))
    bucket, run_uri = r.outputs["bucketName"], r.outputs["runUri"]

    s3 = cloud.admin("s3", REGION)
    s3.create_bucket(Bucket=bucket)
    data = pack()
    s3.put_object(Bucket=bucket, Key=archive_key(data), Body=data)
    boot = pack_boot_scripts()
    s3.put_object(Bucket=bucket, Key=boot_key(boot), Body=boot)
    iam = cloud.admin("iam", REGION)
    arn = iam.create_role(RoleName="trainstack-gcp-p1", AssumeRolePolicyDocument=role["inputs"]["assumeRolePolicy"],
                          )["Role"]["Arn"]
    iam.put_role_policy(RoleName="trainstack-gcp-p1", PolicyName="machine", PolicyDocument=policy["inputs"]["policy"])
    cloud.proxy.trust(arn, role["inputs"]["assumeRolePolicy"], [policy["inputs"]["policy"]])
    return AwsHome(raw=raw, settings=settings, synth=r, bucket=bucket, run_uri=run_uri,
                   run_prefix=run_uri.removeprefix(f"s3://{bucket}/") + "/", code_uri=f"s3://{bucket}/{archive_key(data)}",
                   boot_uri=f"s3://{bucket}/{boot_key(boot)}",
                   home_group=r.outputs["groupName"], gcp_group=r.named("trainstack-group-p1-mig")["inputs"]["name"],
                   machine_role=arn, unique_id=unique_id)


def gce_metadata(home: AwsHome) -> MetadataServer:
    """The metadata server of a machine of the GCP placement: its service account's ID tokens."""
    return MetadataServer(name=f"trainstack-{STACK}-gpu-p1-abcd", service_account_id=home.unique_id)


def gce_machine(tmp: Path, home: AwsHome, md: MetadataServer, endpoint: str, **env: str) -> Sandbox:
    """A sandbox machine of the GCP placement reaching S3 at `endpoint` with its Google identity only:
    the role and audience in its env file, no AWS key in its environment or in a file; `env` on top."""
    run = Run(uri=home.run_uri, bucket=home.bucket, vars={"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": REGION})
    box = Sandbox(tmp, run, md, home.gcp_group, home.code_uri, settings=placement.settings_at(home.settings, 1),
                  warm_trainer=True,
                  env_overrides={**aws_store_env(region=REGION, role_arn=home.machine_role,
                                                 audience=audience(home.gcp_group)),
                                 "TRAINSTACK_BOOT_URI": home.boot_uri})
    for k in STATIC_KEYS:
        box.env.pop(k, None)
    box.env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, **env)
    return box


def assert_ended_with_its_google_identity(cloud: IamCloud, md: MetadataServer, home: AwsHome) -> None:
    """The GCE machine asked only for tokens of its placement's audience, STS gave the role's sessions for
    them (the authorization layer allowed the trust), and one of those sessions wrote COMPLETE, allowed
    by the role's own policy."""
    from runfolder import layout
    from tests.iam.policy_eval import Decision

    assert md.identity_audiences and set(md.identity_audiences) == {audience(home.gcp_group)}
    decisions = cloud.proxy.decisions
    assert ("web-identity", "sts:AssumeRoleWithWebIdentity", home.machine_role, Decision.ALLOW) in decisions
    session_keys = set(cloud.proxy.web_identity_keys)
    assert session_keys
    puts = [d for k, a, res, d in decisions if k in session_keys and a == "s3:PutObject"
            and res.endswith(f"{home.run_prefix}{layout.COMPLETE}")]
    assert puts == [Decision.ALLOW]

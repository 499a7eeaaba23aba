"""JobIdentity: the service account a Vertex AI CustomJob runs as (`trainstack:scheduler: vertex`), and what
`ops start` submits: the `vertexJob` output, schedulers.vertex.JobSpec's fields, from the stack's settings.

What `pulumi up` makes for a Vertex AI stack is what the job needs and nothing that idles: the bucket,
the image repository with the image by digest, the aiplatform API turned on, and this identity. No group,
instance template or controller: Vertex AI starts and releases the machines, and the runtime cap is the
job's own `scheduling.timeout` (schedulers/vertex.py).

The job's container runs as the account (`jobSpec.serviceAccount`), which may read and write this run's
prefix of the bucket and its `cache/` as a machine's account may, read the data sets, and write log
entries; the trainer code is baked into the image, so unlike the machines' it reads no `code/`. Two
of Vertex AI's own service agents act for the job (Google's "Use a custom service account" and "Vertex AI
service agents" pages): the Custom Code Service Agent (`service-<number>@gcp-sa-aiplatform-cc`), which runs
the job's containers, may mint the account's tokens, on this account only; and the image is pulled by
Vertex AI, not by the account, so both agents may read this stack's repository, and no other. Whoever runs
`ops start` needs `iam.serviceAccounts.actAs` on the account (roles/iam.serviceAccountUser), as for any
workload that runs as a service account; the stack grants no person anything.

The CustomJob itself is not a resource here (pulumi-gcp has none, and a job is a run, not infrastructure:
components/aws/job.py says why for SageMaker's), and `ops start` submits it once.

Vertex AI names a job's GPUs apart from its machine type, even where Compute Engine attaches them with
the machine (A2, A3, G2): `accelerator` gives the CustomJob's `machineSpec.acceleratorType` and
`acceleratorCount` for the stack's machine type (and, on N1, its `compute.accelerator`), in the names
of the aiplatform v1 `AcceleratorType` enumeration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from components import catalog, userdata
from components.gcp.identity import BucketAccess, bucket_grants
from runfolder import environment

API = "aiplatform.googleapis.com"
# The job's container's own log entries (Cloud Logging's write-only role; it can read nothing).
LOG_WRITER = "roles/logging.logWriter"
# What the Custom Code Service Agent needs to run the containers as the account: its access tokens.
ACT_AS_ROLE = "roles/iam.serviceAccountTokenCreator"
IMAGE_READER = "roles/artifactregistry.reader"


def custom_code_agent(project_number: str) -> str:
    """The Vertex AI Custom Code Service Agent of a project: it runs a CustomJob's containers."""
    return f"service-{project_number}@gcp-sa-aiplatform-cc.iam.gserviceaccount.com"


@dataclass(kw_only=True)
class JobIdentityArgs:
    """Inputs of a JobIdentity."""

    account_id: str
    """The service account id (6-30 characters)."""
    gcp_project: str
    """The stack's project: Vertex AI's agents are this project's."""
    region: str
    """The region of the repository (and of the job)."""
    repository_id: pulumi.Input[str]
    """The stack's Artifact Registry repository: Vertex AI's agents pull the job's image from it."""
    bucket: BucketAccess
    """The stack's bucket and the run's data: what the job's container reaches."""
    depends_on: list[pulumi.Resource] | None = None
    """The aiplatform API: its service agents exist only once it is on."""


# What a job's container is told besides the trainer's options: its commands and the Keras it runs.
_JOB_KEYS = (environment.EXTRA_ARGS, environment.COMMAND, "TF_USE_LEGACY_KERAS")

# Vertex AI's names of a machine's GPUs (components/catalog.py holds the table; the settings check them too).
NoAccelerator = catalog.NoVertexAccelerator
accelerator = catalog.vertex_accelerator


def job_env(settings, run_uri: str) -> dict[str, str]:
    """The trainer's own `TRAINSTACK_*` options the machines' env file would hold (components/userdata.py's
    `boot_env`), as strings; the machines' own keys (group, boot archive, notice watcher) and the price (Compute
    Engine's Spot figure, not Vertex AI's) are left out."""
    env = userdata.boot_env(settings, run_uri=run_uri, group="", code_uri="")
    unpriced = (environment.PRICE_PER_HOUR, environment.PRICE_NOTE)
    return {k: str(v) for k, v in env.items() if (k in environment.OPTIONS or k in _JOB_KEYS) and k not in unpriced}


def job_spec(settings, *, run_uri: pulumi.Input[str], image: pulumi.Input[str],
             service_account: pulumi.Input[str], job_prefix: str) -> pulumi.Output[str]:
    """The stack's `vertexJob` output (JSON): everything but the deadline, which counts from the run's first start."""
    c = settings.compute
    kind, count = accelerator(c.instance_types[0], c.accelerator, c.gpus_per_node)
    return pulumi.Output.all(run_uri, image, service_account).apply(lambda v: json.dumps({
        "project": settings.project,
        "region": settings.region,
        "run_uri": v[0],
        "image": v[1],
        "service_account": v[2],
        "job_prefix": job_prefix,
        "machine_type": c.instance_types[0],
        "accelerator_type": kind,
        "accelerator_count": count,
        "nodes": c.nodes,
        "disk_gb": c.root_disk_gb,
        "spot": c.spot,
        "max_runtime_s": int(c.max_runtime_hours * 3600),
        "env": job_env(settings, v[0]),
    }, sort_keys=True))


class JobIdentity(pulumi.ComponentResource):
    """The service account a Vertex AI job of this run runs as, its grants, and the grants to Vertex AI's agents."""

    account: gcp.serviceaccount.Account
    email: pulumi.Output[str]
    grants: list[pulumi.Resource]

    def __init__(self, name: str, args: JobIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:JobIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa", account_id=args.account_id, display_name="trainstack Vertex AI job",
            description="one run's bucket prefix and log entries; Vertex AI's agents run and pull for it", opts=child)
        self.email = self.account.email
        member = pulumi.Output.concat("serviceAccount:", self.account.email)
        self.grants = bucket_grants(name, args.bucket, member=member, child=child, code=False)
        self.grants.append(gcp.projects.IAMMember(f"{name}-logs", project=args.gcp_project, role=LOG_WRITER,
                                                  member=member, opts=child))
        # Turned on and asked for: Google creates a service's agent as its API is first used, and an IAM grant
        # to an agent that does not exist yet is refused. ServiceIdentity asks for Vertex AI's main agent now.
        after_api = pulumi.ResourceOptions(parent=self, depends_on=args.depends_on or [])
        service_agent = gcp.projects.ServiceIdentity(f"{name}-agent", project=args.gcp_project, service=API,
                                                     opts=after_api)
        number = gcp.organizations.get_project_output(project_id=args.gcp_project,
                                                      opts=pulumi.InvokeOptions(parent=self)).number
        custom_code = number.apply(lambda n: f"serviceAccount:{custom_code_agent(n)}")
        self.grants.append(gcp.serviceaccount.IAMMember(
            f"{name}-agent-tokens", service_account_id=self.account.name, role=ACT_AS_ROLE, member=custom_code,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[service_agent])))
        for suffix, agent in (("agent", service_agent.member), ("code-agent", custom_code)):
            self.grants.append(gcp.artifactregistry.RepositoryIamMember(
                f"{name}-{suffix}-image-pull", repository=args.repository_id, location=args.region,
                role=IMAGE_READER, member=agent, opts=pulumi.ResourceOptions(parent=self, depends_on=[service_agent])))
        self.register_outputs({"email": self.email})

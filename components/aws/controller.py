"""PlacementController: the serverless controller that moves a run between placements, on AWS.

An EventBridge Scheduler schedule calls a Lambda function every `tick_minutes`; the function runs
one tick of the controller (`controller/handler.py:handler`, configured by the
`TRAINSTACK_PLACEMENTS` variable: controller/config.py) and is gone. Nothing bills while idle
beyond the invocations. The function has its own role, with exactly what a tick needs: read this
run's folder, write only the placement record and the controller's events there, read the groups'
scaling activities, and set the size of this stack's groups only, never above the run's `nodes`.
The scheduler has a role of its own that may invoke this function and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components import function_package, project
from components.aws.identity import deployer_account, role_with_policy
from components.common import ControllerRun
from controller.config import ENV_VAR
from runfolder import layout

# The function's package is components/function_package.py's FUNCTION_PACKAGES and the libraries Lambda's
# python3.12 runtime lacks (it brings boto3): tenacity, and google-auth with its dependencies only
# when a placement is on GCP (function_package.library_files).
HANDLER = "controller.handler.handler"
RUNTIME = "python3.12"
# A tick reads a few small objects and makes a few API calls; a bound far above that, and well
# under the schedule's period, so a stuck tick never overlaps many others.
TIMEOUT_S = 60
MEMORY_MB = 256
# Delivery: EventBridge Scheduler invokes the function asynchronously, and Lambda by default retries a failed
# or timed-out invocation twice and keeps an undelivered one queued for six hours. Here neither retries (the next
# scheduled minute is the retry) and an event older than a minute is dropped (pulumi_aws documents 60-21600 s).
# A tick may still arrive twice (Lambda's asynchronous queue may deliver one event more than once) and overlap
# another tick or `ops move`: correctness rests on placement.json's conditional writes (controller/record.py),
# never on delivery.
RETRY_ATTEMPTS = 0
MAX_EVENT_AGE_S = 60
# Reserved concurrency, only with `placement.reserveConcurrency`: one tick at a time. Off by default, because
# Lambda refuses a reservation that would leave the account under its minimum of unreserved concurrency (100; on
# an account whose limit is 10, common for new accounts, every reservation), and `pulumi up` would then fail at
# the function. `ops preflight` checks the account's room when it is on (ops/preflight/aws.py).
CONCURRENCY = 1
# pulumi_aws's "no reservation" (its default, said explicitly: a stack that turns the key off releases its
# reservation on the next `pulumi up`).
UNRESERVED = -1
LOG_RETENTION_DAYS = 30

# Lambda's limit on all of a function's environment variables together (names and values), in bytes. The
# configuration (TRAINSTACK_PLACEMENTS) is one variable; each GCP placement's `access` adds about 330 bytes.
# With the settings' most placements and the longest names they take it stays several hundred bytes under
# (tests/components/test_placement_controller.py); `environment` refuses, naming the key, if it ever does not.
ENVIRONMENT_MAX_BYTES = 4096


def environment(config: str) -> dict[str, str]:
    """The function's environment: the configuration, refused in one line when Lambda would refuse it."""
    variables = {ENV_VAR: config}
    size = environment_bytes(variables)
    if size > ENVIRONMENT_MAX_BYTES:
        raise ValueError(f"trainstack:placements: the placement controller's configuration takes {size} bytes of "
                         f"Lambda's {ENVIRONMENT_MAX_BYTES} for environment variables; list fewer placements, "
                         "or shorter stack, run and project names")
    return variables


def environment_bytes(variables: dict[str, str]) -> int:
    """What Lambda counts of `variables` against its limit: every name and value, in bytes."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in variables.items())


# What a tick does on Auto Scaling: the two reads have no resource-level permissions ("*").
READ_GROUP_ACTIONS = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities"]
SIZE_GROUP_ACTIONS = ["autoscaling:UpdateAutoScalingGroup"]
# The placements' spot prices and capacity scores (controller/prices.py): no resource-level permissions ("*").
PRICE_ACTIONS = ["ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores"]
# The only objects the controller writes, relative to the run folder.
# The record and its events; the run's deadline when no machine has written it yet, and TIMED_OUT when
# the deadline passed with no machine to end the run, CANCELLED when a stop no trainer heeds was asked
# (controller/tick.py); the price cache, and a folder of decision
# tables (controller/prices.py, controller/table.py).
WRITES = (layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY, layout.DEADLINE_KEY, layout.TIMED_OUT, layout.CANCELLED,
          layout.PRICES_KEY)
WRITE_PREFIXES = (layout.DECISIONS_PREFIX,)


def function_name(name: str) -> str:
    """The function's (and its schedule's) name: Lambda takes 64 characters, the schedule 64 too."""
    return f"{name[:53]}-controller"


def role_name(name: str) -> str:
    """The function's role's name when it is named in advance (IAM role names take 64 characters)."""
    return function_name(name)


@dataclass(kw_only=True)
class PlacementControllerArgs:
    """Inputs of a PlacementController."""

    run: ControllerRun
    """The function's name, configuration, run folder, machines and tick (the same on both clouds)."""
    groups: list[tuple[str, str]]
    """(region, name) of every placement's group, home first."""
    bucket_arn: pulumi.Input[str]
    """ARN of the home bucket."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for every resource."""
    federation: bool = False
    """Some placement is on GCP: the package carries google-auth (and cryptography and cffi, built for
    Lambda) to reach its group."""
    named_role: bool = False
    """Name the function's role `role_name(name)` (instead of a generated name): a GCP placement's workload
    identity provider admits that role by name, and must know it before the role exists."""
    reserve_concurrency: bool = False
    """Reserve CONCURRENCY of the account's concurrent executions for the function (`placement.reserveConcurrency`):
    one tick at a time. None reserved by default: the ticks are safe side by side."""


def function_policy(*, partition: pulumi.Input[str], account_id: pulumi.Input[str], bucket_arn: pulumi.Input[str],
                    run_id: str, nodes: int, groups: list[tuple[str, str]]) -> pulumi.Output[str]:
    """The function's permissions: the run folder, the placement record, the price cache and decision tables, the
    groups' reads and sizes, the spot prices."""
    run_prefix = layout.run_prefix(run_id).rstrip("/")
    statements = [
        {"Sid": "ListRunFolder", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{run_prefix}/", f"{run_prefix}/*"]}}},
        {"Sid": "ReadRunFolder", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": pulumi.Output.concat(bucket_arn, f"/{run_prefix}/*")},
        {"Sid": "WritePlacement", "Effect": "Allow", "Action": "s3:PutObject",
         "Resource": [pulumi.Output.concat(bucket_arn, f"/{run_prefix}/{key}") for key in WRITES]
         + [pulumi.Output.concat(bucket_arn, f"/{run_prefix}/{prefix}*") for prefix in WRITE_PREFIXES]},
        {"Sid": "ReadGroups", "Effect": "Allow", "Action": READ_GROUP_ACTIONS, "Resource": "*"},
        {
            # Sizes no larger than the run's: a request must send MinSize and MaxSize (a missing key
            # fails the condition), and the desired capacity can never exceed MaxSize.
            "Sid": "SizeGroups", "Effect": "Allow", "Action": SIZE_GROUP_ACTIONS,
            "Resource": [pulumi.Output.concat("arn:", partition, ":autoscaling:", region, ":", account_id,
                                              ":autoScalingGroup:*:autoScalingGroupName/", name)
                         for region, name in groups],
            "Condition": {"NumericLessThanEquals": {"autoscaling:MinSize": str(nodes),
                                                    "autoscaling:MaxSize": str(nodes)}},
        },
        # No resource: the placements' regions (ec2:Region, the calls' one condition key) narrow them.
        {"Sid": "ReadSpotPrices", "Effect": "Allow", "Action": PRICE_ACTIONS, "Resource": "*",
         "Condition": {"StringEquals": {"ec2:Region": sorted({region for region, _name in groups})}}},
    ]
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements})


def function_code(*, federation: bool = False, decision: str | None = None) -> pulumi.AssetArchive:
    """The function's package: the .py files of the controller, the trainer and the libraries they need
    beyond Lambda's runtime (function_package.library_files: with `federation`, those reaching a GCP group too),
    at their package paths, and the price decision's inputs (`decision`, at `function_package.DECISION_FILE`)."""
    files = function_package.function_files(project.ROOT)
    if function_package.HANDLER_FILE not in files:
        pulumi.log.warn(f"{function_package.HANDLER_FILE} is not in {project.ROOT}: the placement controller's function "
                        "would have no handler")
    files.update(function_package.library_files(federation=federation))
    assets: dict[str, pulumi.Asset] = {name: pulumi.FileAsset(str(path)) for name, path in files.items()}
    if decision is not None:
        assets[function_package.DECISION_FILE] = pulumi.StringAsset(decision)
    return pulumi.AssetArchive(assets)


class PlacementController(pulumi.ComponentResource):
    """A schedule that runs the placement controller's tick as a Lambda function."""

    function: aws.lambda_.Function
    schedule: aws.scheduler.Schedule
    role: aws.iam.Role
    function_name: pulumi.Output[str]

    def __init__(self, name: str, args: PlacementControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:PlacementController", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        partition, account_id = deployer_account(self)
        # Lambda function names take 64 characters; the schedule's, 64 too.
        fn_name = function_name(args.run.name)
        ready = self._role(name, args, fn_name, partition, account_id)
        self.function = aws.lambda_.Function(
            f"{name}-function",
            name=fn_name,
            description="trainstack: moves the run to another placement when its own cannot launch",
            runtime=RUNTIME,
            handler=HANDLER,
            code=function_code(federation=args.federation, decision=args.run.decision),
            role=self.role.arn,
            timeout=TIMEOUT_S,
            memory_size=MEMORY_MB,
            reserved_concurrent_executions=CONCURRENCY if args.reserve_concurrency else UNRESERVED,
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables=pulumi.Output.from_input(args.run.config).apply(environment)),
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=ready),
        )
        aws.lambda_.FunctionEventInvokeConfig(
            f"{name}-delivery",
            function_name=self.function.name,
            maximum_retry_attempts=RETRY_ATTEMPTS,
            maximum_event_age_in_seconds=MAX_EVENT_AGE_S,
            opts=child,
        )
        self._schedule(name, args, fn_name, account_id)
        self.function_name = self.function.name
        self.register_outputs({"function_name": self.function_name})

    def _role(self, name: str, args: PlacementControllerArgs, fn_name: str, partition: pulumi.Output[str],
              account_id: pulumi.Output[str]) -> list[pulumi.Resource]:
        """The function's role, its log group and its policies; returns what the function waits for."""
        child = pulumi.ResourceOptions(parent=self)
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=f"/aws/lambda/{fn_name}", retention_in_days=LOG_RETENTION_DAYS, tags=args.tags,
            opts=child,
        )
        self.role, policy = role_with_policy(
            self, name,
            role_name=role_name(args.run.name) if args.named_role else None,
            trust=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole",
            }]}),
            description="trainstack placement controller: one run's folder and placement record, this stack's groups",
            tags=args.tags,
            policy=function_policy(partition=partition, account_id=account_id, bucket_arn=args.bucket_arn,
                                   run_id=args.run.run_id, nodes=args.run.nodes, groups=args.groups),
        )
        logs = aws.iam.RolePolicy(
            f"{name}-logging",
            role=self.role.id,
            # Its own log group only (AWSLambdaBasicExecutionRole would allow every log group).
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                "Sid": "OwnLogs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": pulumi.Output.concat(log_group.arn, ":*"),
            }]}),
            opts=child,
        )
        return [policy, logs, log_group]

    def _schedule(self, name: str, args: PlacementControllerArgs, fn_name: str, account_id: pulumi.Output[str]) -> None:
        """The EventBridge schedule that invokes the function every `tick_minutes`, and its own role."""
        child = pulumi.ResourceOptions(parent=self)
        scheduler_role = aws.iam.Role(
            f"{name}-scheduler-role",
            # EventBridge Scheduler's own confused-deputy guard: only schedules of this account.
            assume_role_policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "scheduler.amazonaws.com"}, "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
            }]}),
            description="trainstack placement controller's schedule: invoke its function only",
            tags=args.tags,
            opts=child,
        )
        invoke_policy = aws.iam.RolePolicy(
            f"{name}-scheduler-policy",
            role=scheduler_role.id,
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                "Sid": "InvokeController", "Effect": "Allow", "Action": "lambda:InvokeFunction",
                "Resource": self.function.arn,
            }]}),
            opts=child,
        )
        self.schedule = aws.scheduler.Schedule(
            f"{name}-schedule",
            name=fn_name,
            description="trainstack: one placement controller tick",
            schedule_expression=f"rate({args.run.tick_minutes} minute{'s' if args.run.tick_minutes > 1 else ''})",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            state="ENABLED",
            target=aws.scheduler.ScheduleTargetArgs(
                arn=self.function.arn,
                role_arn=scheduler_role.arn,
                # A failed tick is not retried: the next one starts again from the run folder.
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                    maximum_retry_attempts=RETRY_ATTEMPTS, maximum_event_age_in_seconds=MAX_EVENT_AGE_S),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke_policy]),
        )

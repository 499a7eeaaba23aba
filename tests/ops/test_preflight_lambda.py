"""`ops preflight`'s Lambda check: with `placement.reserveConcurrency`, room in the account to reserve the
controller's execution, read with Lambda's GetAccountSettings (and the function's own reservation from an
earlier `pulumi up`, GetFunctionConcurrency).

moto has no GetAccountSettings: a real botocore client with `Stubber`, which checks each request and each
answer against Lambda's service model.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from components import settings as config
from components.aws.controller import CONCURRENCY
from ops import preflight
from ops.preflight import aws as preflight_aws

REGION = "eu-west-1"
PLACES = {
    "cloud": "aws", "region": REGION, "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "placements": [{"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]}],
}


def settings(reserve: bool = True, **raw) -> config.Settings:
    return config.load_settings({**PLACES, "placement": {"reserveConcurrency": reserve}, **raw}, stack="unit")


def account(limit: int, unreserved: int) -> dict:
    return {"AccountLimit": {"TotalCodeSize": 80530636800, "CodeSizeUnzipped": 262144000, "CodeSizeZipped": 52428800,
                             "ConcurrentExecutions": limit, "UnreservedConcurrentExecutions": unreserved},
            "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0}}


def stubbed(limit: int, unreserved: int, held: int | None, s: config.Settings) -> tuple[object, Stubber]:
    """A Lambda client answering GetAccountSettings, then GetFunctionConcurrency for the controller's function:
    `held` executions reserved by an earlier `pulumi up`, or None when the function does not exist yet."""
    client = boto3.client("lambda", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("get_account_settings", account(limit, unreserved), {})
    name = {"FunctionName": preflight_aws.aws_controller_function(s)}
    if held is None:
        stub.add_client_error("get_function_concurrency", "ResourceNotFoundException", "Function not found",
                              404, expected_params=name)
    else:
        stub.add_response("get_function_concurrency", {"ReservedConcurrentExecutions": held}, name)
    stub.activate()
    return client, stub


@pytest.mark.parametrize(("limit", "unreserved", "held", "left"), [
    (10, 10, None, 9),      # a new account: its limit is 10, every reservation is refused
    (1000, 100, None, 99),  # other functions reserve all but the minimum
    (1000, 100, 0, 99),     # the function exists without a reservation
])
def test_a_reservation_lambda_would_refuse_is_one_line_naming_the_key(limit, unreserved, held, left) -> None:
    s = settings()
    client, stub = stubbed(limit, unreserved, held, s)
    (problem,) = preflight_aws.aws_lambda_concurrency_problems(s, client)
    stub.assert_no_pending_responses()
    assert problem.what.startswith(f"placement.reserveConcurrency: reserving {CONCURRENCY} of the account's Lambda "
                                   f"concurrency in {REGION} for ")
    assert f"would leave {left} unreserved (the account's limit is {limit}, {unreserved} unreserved now)" in problem.what
    assert "Lambda keeps at least 100: `pulumi up` would fail at the controller's function" in problem.what
    assert problem.fix.startswith("set placement.reserveConcurrency: false")
    # The limit that leaves exactly the minimum after the reservation.
    assert f"--quota-code L-B99A9384 --desired-value {limit + 100 - left} --region {REGION}" in problem.fix


@pytest.mark.parametrize(("limit", "unreserved", "held"), [
    (1000, 1000, None),  # the usual account
    (1000, 101, None),   # exactly the minimum left after the reservation
    (1000, 100, 1),      # an earlier `pulumi up` reserved it already: kept, not added
])
def test_room_for_the_reservation_is_no_problem(limit, unreserved, held) -> None:
    s = settings()
    client, stub = stubbed(limit, unreserved, held, s)
    assert preflight_aws.aws_lambda_concurrency_problems(s, client) == []
    stub.assert_no_pending_responses()  # both reads were made: the verdict came from them


def test_the_function_named_is_the_one_the_stack_creates() -> None:
    from ops import synth

    s = settings()
    r = synth.synthesize({**PLACES, "placement": {"reserveConcurrency": True}}, stack="unit")
    (fn,) = r.of_type("aws:lambda/function:Function")
    assert fn["inputs"]["name"] == preflight_aws.aws_controller_function(s)
    assert fn["inputs"]["reservedConcurrentExecutions"] == CONCURRENCY


class Session:
    """Only a Lambda client: any other client is a stand-in whose checks fail (and become problems)."""

    def __init__(self, lam: object) -> None:
        self.lam, self.asked = lam, []

    def client(self, name: str, region_name: str | None = None):
        self.asked.append(name)
        return self.lam if name == "lambda" else object()


def test_preflight_asks_lambda_only_when_the_key_is_on_and_there_is_a_controller() -> None:
    # Key on: the Lambda check runs at home and says what Lambda would refuse (the other checks cannot run here).
    s = settings()
    client, stub = stubbed(10, 10, None, s)
    problems = preflight.check(s, aws_session=Session(client))
    stub.assert_no_pending_responses()
    assert [p.what for p in problems if p.what.startswith("placement.reserveConcurrency")] != []
    # Off (the default), or on with one placement (no controller): Lambda is never asked.
    alone = config.load_settings({**PLACES, "placements": PLACES["placements"][:1],
                                  "placement": {"reserveConcurrency": True}}, stack="u")
    for off in (settings(reserve=False), alone):
        session = Session(None)
        preflight.check(off, aws_session=session)
        assert "lambda" not in session.asked
        assert session.asked  # the other checks did ask for their clients
    assert preflight_aws.aws_lambda_concurrency_problems(alone, None) == []


def test_the_key_is_refused_on_a_gcp_home() -> None:
    raw = {"cloud": "gcp", "region": "us-central1", "project": "my-project", "run": {"synthetic": True},
           "compute": {"instanceTypes": ["g2-standard-4"]}, "placement": {"reserveConcurrency": True}}
    with pytest.raises(config.ConfigError, match=r"^trainstack:placement\.reserveConcurrency: true: reserves "
                                                 r"concurrency for an AWS home's Lambda function only"):
        config.load_settings(raw, stack="u")
    assert not config.load_settings({**raw, "placement": {}}, stack="u").placement.reserve_concurrency

"""Reading the config before validating it: a stack file's keys by namespace, the provider's region
for the stack's own cloud, and the program's config through the SDK; each refusal by its whole line."""

from __future__ import annotations

import pytest

from components.settings import loading
from components.settings.errors import NO_SECRETS, ConfigError
from tests.components.test_settings import DEV, _from_sdk

PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def _refused(fn, *args) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value


def test_a_stack_file_with_a_character_yaml_refuses_says_so_without_a_position(tmp_path):
    """The reader's error has no problem mark: the line is still one clear line, not a crash."""
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("config:\n  trainstack:cloud: aws\x07\n")
    err = _refused(loading.read_stack_file, path)
    assert str(err) == ("trainstack:config: Pulumi.x.yaml is not valid YAML: unacceptable character #x0007: "
                        "special characters are not allowed")



@pytest.mark.parametrize(("text", "line"), [
    # A scanner error without a context: its position only.
    ("config:\n  trainstack:cloud: a: b\n",
     "trainstack:config: Pulumi.x.yaml is not valid YAML at line 2, column 22: mapping values are not allowed here"),
    # A bracket opened and closed wrong on one line: no "opened at line" for the same line.
    ("config: [a, b}\n",
     "trainstack:config: Pulumi.x.yaml is not valid YAML at line 1, column 14: expected ',' or ']', but got '}'"),
    ("- a\n- b\n", "trainstack:config: Pulumi.x.yaml: expected a mapping with a config: block"),
], ids=["no-context", "opened-on-the-same-line", "not-a-mapping"])
def test_a_stack_file_that_is_no_config_mapping_is_refused_by_its_whole_line(tmp_path, text, line):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(text)
    err = _refused(loading.read_stack_file, path)
    assert (err.key, str(err)) == ("config", line)

def test_only_the_namespace_before_the_first_colon_is_trainstack_s():
    assert loading.raw_from_config({"trainstack:x:y": 1, "trainstack:cloud": "gcp", "other:trainstack:z": 2}) == {
        "x:y": 1, "cloud": "gcp"}


@pytest.mark.parametrize(("cfg", "line"), [
    ({"trainstack:cloud": "gcp", "trainstack:region": "us-central1", "gcp:region": "europe-west1",
      "aws:region": "us-central1"},
     "gcp:region: 'europe-west1' differs from trainstack:region 'us-central1'; remove it (the stack sets its "
     "provider's region itself)"),
    # No trainstack:cloud: the stack is AWS's.
    ({"trainstack:region": "us-east-1", "aws:region": "eu-west-1", "gcp:region": "us-east-1"},
     "aws:region: 'eu-west-1' differs from trainstack:region 'us-east-1'; remove it (the stack sets its provider's "
     "region itself)"),
], ids=["gcp", "aws-by-default"])
def test_the_provider_region_compared_is_the_stack_s_own_cloud_s(cfg, line):
    assert str(_refused(loading.raw_from_config, cfg)) == line
    # The other cloud's region key is none of the stack's business.
    other = {k: v for k, v in cfg.items() if k not in ("gcp:region", "aws:region")}
    own = "gcp:region" if cfg.get("trainstack:cloud") == "gcp" else "aws:region"
    assert loading.raw_from_config({**other, "gcp:region" if own == "aws:region" else "aws:region": "elsewhere-1"})


def test_the_program_s_config_refuses_a_secret_by_its_whole_line():
    assert str(_refused(_from_sdk, dict(DEV["config"]), ["trainstack:run"])) == "trainstack:run: is a secret; " + NO_SECRETS


def test_the_program_s_config_reads_past_other_namespaces():
    # "aws:region" sorts before every trainstack key: the key after it is still read (and refused).
    cfg = {**DEV["config"], "aws:region": "us-east-1", "trainstack:regoin": "us-east-1"}
    err = _refused(_from_sdk, cfg, [])
    assert (err.key, str(err)) == ("regoin", "trainstack:regoin: unknown key; did you mean trainstack:region?")


def test_the_program_s_config_splits_the_namespace_at_the_first_colon():
    err = _refused(_from_sdk, {**DEV["config"], "trainstack:foo:bar": "1"}, [])
    # Like nothing known: every known key is named instead of a guess.
    assert (err.key, str(err)) == ("foo:bar", "foo:bar: unknown key; expected one of: access, cloud, compute, image, "
                                   "kubernetes, placement, placements, project, region, run, scheduler, serve, storage")


def test_the_program_s_unknown_key_is_checked_for_secrets_with_its_value():
    err = _refused(_from_sdk, {**DEV["config"], "trainstack:sshKey": PRIVATE_KEY}, [])
    assert str(err) == ("trainstack:sshKey: holds a private key block (give the public key: ssh-keygen -y -f KEY); "
                        + NO_SECRETS)


def test_the_program_s_empty_scalar_is_not_given():
    """An empty value (`pulumi config set trainstack:region ""`) is as if unset: the required key's line."""
    err = _refused(_from_sdk, {**DEV["config"], "trainstack:region": ""}, [])
    assert str(err) == "trainstack:region: is required"

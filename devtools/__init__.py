"""Tools for working on trainstack that both the tests and the bench use; never shipped.

Not under `tests/` because `bench/` is no test and must not import the test suite (a test
module may import pytest, fixtures and test data the bench has no business loading); not in
`trainer/`, `ops/` or `components/` because the product never starts an emulator. Code
here imports neither pytest nor anything of `tests/` or `bench/`
(`tests/bench/test_imports.py` checks both).

- `servers.py`: moto_server, the GCS emulator, free ports; `Run`, a run root on one of them.
- `fault_proxy.py`: an HTTP proxy that fails, drops, slows or cuts requests on demand.
- `metadata.py`: the instance metadata service (IMDSv2 and GCE's) on 127.0.0.1.
- `machine_commands.py`: a machine's commands (`docker`, `aws`, `gcloud`, `apt-get`, `mount`,
  `shutdown`…) as fakes that record their calls; `cli_server.py` and `cli_client.py` serve the
  cloud CLIs among them warm.
- `sandbox.py`: the boot sandbox, a machine booting the rendered user data for real on the above.
- `story_run.py`: a run folder of a night on spot machines (preemptions, a move, evaluations), for
  `ops dashboard`'s tests, bench and screenshots.
"""

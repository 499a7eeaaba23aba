"""What `ops stop`, `ops logs` and `ops status` ask of a Job stack's cluster (`trainstack:scheduler:
kubernetes`), through the official Kubernetes Python client.

- stop: before the trainer has committed (no COMPLETE), the Job is suspended (`spec.suspend: true`): its pods
  get their grace period and the Job stays, to be resumed with `suspend: false` at the last checkpoint; after
  the trainer has committed it is deleted with its pods (nothing of the run lives in the Job).
- logs: the trainer container's log of each of the Job's pods (selected by the `job-name` label the Job
  controller sets), newest pod last.
- status: the Job's conditions, its failed pods (what counts against backoffLimit) and the pods ended by a
  disruption (the `DisruptionTarget` condition: evictions, spot terminations), which podFailurePolicy ignores.

The cluster is reached as the stack says (a kubeconfig context, or the kubeconfig text), never the current
context taken silently. Every call has a timeout.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.cli import EXIT_ERROR, EXIT_OK

JOB_NAME = "train"  # components/kubernetes/stack.py's JOB_NAME (ops does not import components)
TRAINER_CONTAINER = "trainer"
TIMEOUT_S = 20  # each API call's bound
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # the Job controller sets it on each pod


def api_client(*, context: str | None = None, kubeconfig: dict | None = None):
    """A client for the cluster named by `context` (in the kubeconfig file) or by a whole kubeconfig."""
    import os

    from kubernetes import config

    if (context is None) == (kubeconfig is None):
        raise ValueError("name the cluster: a kubeconfig context or the kubeconfig itself, one of them")
    if kubeconfig is not None:
        return config.new_client_from_config_dict(kubeconfig)
    # KUBECONFIG as it is now (the client reads it once, at import), else the file kubectl uses.
    return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or "~/.kube/config",
                                         context=context)


@dataclass
class JobView:
    """The Job as `ops status` shows it."""

    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message), status True
    suspended: bool = False
    active: int = 0
    succeeded: int = 0
    failed: int = 0  # counted against backoffLimit
    disrupted: list[tuple[str, str]] = field(default_factory=list)  # (pod, reason) ignored by podFailurePolicy

    def to_json(self) -> dict:
        """The Job as `ops status --json` prints it."""
        return {"name": JOB_NAME, "suspended": self.suspended, "active": self.active, "succeeded": self.succeeded,
                "failed": self.failed,
                "conditions": [{"type": t, "reason": r, "message": m} for t, r, m in self.conditions],
                "disrupted": [{"pod": p, "reason": r} for p, r in self.disrupted]}

    def lines(self) -> list[str]:
        out = [f"job {JOB_NAME}: {'suspended, ' if self.suspended else ''}{self.active} active, "
               f"{self.succeeded} succeeded, {self.failed} failed (counted), {len(self.disrupted)} ended by a "
               "disruption (not counted)"]
        out += [f"  condition {t}: {reason}{' - ' + msg if msg else ''}" for t, reason, msg in self.conditions]
        out += [f"  pod {pod}: {reason}" for pod, reason in self.disrupted]
        return out


def job_view(client, namespace: str) -> JobView:
    """The Job's conditions and counts, and its pods ended by a disruption."""
    from kubernetes import client as k

    job = k.BatchV1Api(client).read_namespaced_job_status(JOB_NAME, namespace, _request_timeout=TIMEOUT_S)
    st = job.status
    view = JobView(conditions=[(c.type, c.reason or "", c.message or "") for c in (st.conditions or [])
                               if c.status == "True"],
                   suspended=bool(job.spec.suspend), active=st.active or 0, succeeded=st.succeeded or 0,
                   failed=st.failed or 0)
    for pod in _pods(client, namespace):
        for c in pod.status.conditions or []:
            if c.type == "DisruptionTarget" and c.status == "True":
                view.disrupted.append((pod.metadata.name, c.reason or ""))
    return view


def _pods(client, namespace: str) -> list:
    from kubernetes import client as k

    pods = k.CoreV1Api(client).list_namespaced_pod(namespace, label_selector=f"job-name={JOB_NAME}",
                                                    _request_timeout=TIMEOUT_S).items
    return sorted(pods, key=lambda p: (p.metadata.creation_timestamp is None, p.metadata.creation_timestamp,
                                       p.metadata.name))


def logs(client, namespace: str, *, tail_lines: int | None = None) -> list[tuple[str, str]]:
    """(pod, the trainer container's log) of each of the Job's pods, oldest first."""
    from kubernetes import client as k

    core = k.CoreV1Api(client)
    out = []
    for pod in _pods(client, namespace):
        kwargs = {"tail_lines": tail_lines} if tail_lines else {}
        # The raw text: preloaded, the client would parse a log of JSON lines (the trainer's events) as data.
        resp = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=TRAINER_CONTAINER,
                                            _request_timeout=TIMEOUT_S, _preload_content=False, **kwargs)
        out.append((pod.metadata.name, resp.data.decode("utf-8", "replace")))
    return out


# `ops logs --follow`: a stream that drops while its pod runs is reopened, at most this many times in a row with no
# new line, this long apart; a stream with nothing to read for FOLLOW_READ_S is treated as dropped (the pod is asked).
FOLLOW_RECONNECTS = 5
RECONNECT_WAIT_S = 2.0
FOLLOW_READ_S = 300
ENDED = ("Succeeded", "Failed")


class FollowError(Exception):
    """The log stream could not be kept: one line saying why."""


def _log_lines(core, pod: str, namespace: str, *, follow: bool):
    """The trainer container's log of `pod` as complete lines (bytes, with their newline) and, last, the partial
    line at its end (b"" when none); with `follow`, as they come until the stream ends or drops."""
    kwargs = {"follow": True, "_request_timeout": (TIMEOUT_S, FOLLOW_READ_S)} if follow else {
        "_request_timeout": TIMEOUT_S}
    resp = core.read_namespaced_pod_log(pod, namespace, container=TRAINER_CONTAINER, _preload_content=False,
                                        **kwargs)
    rest = b""
    try:
        for chunk in resp.stream(amt=None, decode_content=False):
            rest += chunk
            *lines, rest = rest.split(b"\n")
            for line in lines:
                yield line + b"\n"
    finally:
        resp.release_conn()
    yield rest


def follow(client, namespace: str, out, *, pod: str | None = None, tail_lines: int | None = None,
           sleep=time.sleep, reconnects: int = FOLLOW_RECONNECTS) -> str:
    """Write the trainer's log of `pod` (default: the Job's newest pod still running, the chief's with several
    workers, else its newest) to the binary
    `out` as it comes, until the pod ends; returns how it ended ("Succeeded", or "Failed" with its DisruptionTarget
    reason). A stream that ends while the pod runs (a dropped connection, an API server's restart) is reopened and
    the lines already written skipped; `reconnects` times in a row with nothing new ends it with FollowError."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    core = k.CoreV1Api(client)
    if pod is None:
        pods = _pods(client, namespace)
        if not pods:
            raise FollowError(f"job {JOB_NAME} has no pod in {namespace} (suspended, deleted, or not scheduled yet)")
        running = [p for p in pods if (p.status.phase or "") not in ENDED]
        # With several workers, the chief's (index 0): it writes the run's events.
        chief = [p for p in running if (p.metadata.labels or {}).get(COMPLETION_INDEX_LABEL) == "0"]
        pod = (chief or running or pods)[-1].metadata.name
    seen = 0
    if tail_lines is not None:  # the last tail_lines lines so far, then what comes
        seen = max(0, sum(1 for line in _log_lines(core, pod, namespace, follow=False) if line) - tail_lines)
    quiet = 0
    while True:
        written, partial, dropped = 0, b"", "closed"
        try:
            for n, line in enumerate(_log_lines(core, pod, namespace, follow=True)):
                if not line.endswith(b"\n"):
                    partial = line
                elif n >= seen:
                    out.write(line)
                    out.flush()
                    seen, written = seen + 1, written + 1
        except Exception as e:  # noqa: BLE001 - a dropped stream raises urllib3's many types; the pod's phase decides
            dropped = type(e).__name__
        try:
            state = core.read_namespaced_pod(pod, namespace, _request_timeout=TIMEOUT_S).status
        except ApiException as e:
            if e.status != 404:
                raise
            state = None
        if state is None or (state.phase or "") in ENDED:
            if state is not None:  # the end of the log, in case the stream dropped just before it
                lines = list(_log_lines(core, pod, namespace, follow=False))
                out.write(b"".join(lines[seen:]))
            elif partial:
                out.write(partial)
            out.flush()
            if state is None:
                return "deleted"
            reasons = [c.reason for c in state.conditions or [] if c.type == "DisruptionTarget" and c.status == "True"]
            return state.phase + (f" ({reasons[0]})" if reasons else "")
        quiet = 0 if written else quiet + 1
        if quiet > reconnects:
            raise FollowError(f"the log stream of pod {pod} ended {quiet} times in a row with nothing new while the "
                              f"pod is {state.phase} (last: {dropped}); try again, or kubectl -n {namespace} logs -f {pod} -c {TRAINER_CONTAINER}")
        sleep(RECONNECT_WAIT_S)


# Where each kind `apply` takes lives in the API: (client class, create method, replace method).
_KINDS = {
    "Deployment": ("AppsV1Api", "create_namespaced_deployment", "replace_namespaced_deployment"),
    "Service": ("CoreV1Api", "create_namespaced_service", "replace_namespaced_service"),
    "NetworkPolicy": ("NetworkingV1Api", "create_namespaced_network_policy", "replace_namespaced_network_policy"),
}


def apply(client, objects: list[dict]) -> list[tuple[str, str, str]]:
    """Create each object (serving's Deployment, Service, NetworkPolicy), or replace it where it exists (a
    later `ops serve`); returns (kind, name, "created" or "replaced")."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    done = []
    for o in objects:
        api_class, create, replace = _KINDS[o["kind"]]
        api = getattr(k, api_class)(client)
        name, ns = o["metadata"]["name"], o["metadata"]["namespace"]
        try:
            getattr(api, create)(ns, o, _request_timeout=TIMEOUT_S)
            done.append((o["kind"], name, "created"))
        except ApiException as e:
            if e.status != 409:
                raise
            getattr(api, replace)(name, ns, o, _request_timeout=TIMEOUT_S)
            done.append((o["kind"], name, "replaced"))
    return done


def serve(settings, store, client, *, run_uri: str) -> tuple[str, int, list[tuple[str, str, str]]]:
    """`ops serve`: check the COMPLETE run's model and publish its next version (components/kubernetes/
    serving.py's `prepare`), then apply tensorflow/serving of the training's version, pinned by digest, in the
    run's namespace. Returns (the training's TensorFlow version, the version published, what `apply` did)."""
    from components.kubernetes import serving
    from components.kubernetes.stack import namespace_name
    from components.settings.errors import ConfigError

    want = settings.serve
    if settings.scheduler != "kubernetes" or not want.enabled:
        raise ConfigError("serve.enabled", "is not true on this stack (scheduler kubernetes): set serve.enabled: "
                          "true to serve its run's model")
    trained, version, _keys = serving.prepare(store)
    image = serving.serving_image(trained)
    ns, run_id = namespace_name(settings), settings.run_id
    objects = [serving.deployment(ns, run_id, image=image, base_path=run_uri.rstrip("/") + "/serving",
                                  replicas=want.replicas, cpu=want.resources.cpu, memory=want.resources.memory,
                                  # tensorflow/serving has had no s3:// since 2.7: the trainer's image copies it.
                                  fetch_image=settings.image.reference if run_uri.startswith("s3://") else None,
                                  version=version),
               serving.service(ns, run_id), serving.network_policy(ns, run_id)]
    return trained, version, apply(client, objects)


def stop(client, namespace: str, *, committed: bool) -> str:
    """Suspend the Job, or delete it (and its pods) once the trainer has committed; what was done."""
    from kubernetes import client as k

    batch = k.BatchV1Api(client)
    if committed:
        batch.delete_namespaced_job(JOB_NAME, namespace, propagation_policy="Background",
                                    _request_timeout=TIMEOUT_S)
        return "deleted"
    batch.patch_namespaced_job(JOB_NAME, namespace, {"spec": {"suspend": True}}, _request_timeout=TIMEOUT_S)
    return "suspended"


def stack_kubeconfig(stack: str) -> dict:
    """The kubeconfig a `kubeconfigSecret: true` stack holds as the Pulumi secret kubernetes:kubeconfig, as the
    pulumi CLI decrypts it (`pulumi config get kubernetes:kubeconfig --stack NAME`, in the project folder)."""
    import shutil

    import yaml

    from components.settings import ConfigError
    from ops import hosts

    exe = shutil.which("pulumi")
    if exe is None:
        raise ConfigError("kubernetes.kubeconfigSecret", "the kubeconfig is a Pulumi secret and the pulumi CLI is "
                          "not on PATH to read it; install it, or name a context of your kubeconfig file instead")
    what = f"pulumi config get kubernetes:kubeconfig --stack {stack}"
    proc = hosts._run_cli([exe, "config", "get", "kubernetes:kubeconfig", "--stack", stack], what,
                          hosts.PULUMI_TIMEOUT_S, cwd=hosts.ROOT)
    try:
        doc = yaml.safe_load(proc.stdout)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, dict) or not doc.get("clusters"):
        raise ConfigError("kubernetes.kubeconfigSecret", f"{what} printed no kubeconfig (a YAML or JSON document "
                          "with clusters:); set it with pulumi config set --secret kubernetes:kubeconfig \"$(cat FILE)\"")
    return doc


def stack_client(settings, stack: str):
    """A client for a Job stack's cluster as the stack reaches it: its named context, or its kubeconfig secret."""
    k = settings.kubernetes
    if k.context is not None:
        return api_client(context=k.context)
    return api_client(kubeconfig=stack_kubeconfig(stack))


def job_stack_settings(stack: str | None, stacks_dir: Path | None = None):
    """A Job stack's settings from its stack file; None for any other stack, or none named (--run-uri alone: the
    run folder does not name the cluster)."""
    from ops import synth

    if stack is None:
        return None
    path = Path(stacks_dir or synth.STACKS_DIR) / f"Pulumi.{stack}.yaml"
    if not path.exists():
        return None
    settings = synth.load_source(path).settings
    return settings if settings.scheduler == "kubernetes" else None


def _job_stack(stack: str | None, stacks_dir: Path | None, client):
    """(client, namespace) of a Job stack's cluster; None for any other stack."""
    settings = job_stack_settings(stack, stacks_dir)
    if settings is None:
        return None
    from components.kubernetes.stack import namespace_name

    return client or stack_client(settings, stack), namespace_name(settings)


def stop_for_stack(stack: str | None, store, *, stacks_dir: Path | None = None, client=None) -> str | None:
    """`ops stop --stack NAME` on a Job stack: suspend its Job, or delete it once the run is COMPLETE (`stop`);
    None for any other stack."""
    from runfolder import layout
    from runfolder.storage import NotFound

    target = _job_stack(stack, stacks_dir, client)
    if target is None:
        return None
    try:
        store.get_bytes(layout.COMPLETE)
        committed = True
    except NotFound:
        committed = False
    return stop(target[0], target[1], committed=committed)


def end_of(view: JobView, *, stop_requested: bool = False) -> tuple[str, str] | None:
    """The run's end marker and reason for a Job that failed (its `Failed` condition), or None while it has not:
    activeDeadlineSeconds (DeadlineExceeded) is the run's runtime cap, TIMED_OUT as on the groups; any other
    failure (BackoffLimitExceeded, PodFailurePolicy) is FAILED."""
    from runfolder import layout

    failed = next(((reason, message) for t, reason, message in view.conditions if t == "Failed"), None)
    if failed is None:
        return None
    reason, message = failed
    text = f"the Job failed: {reason or 'no reason given'}" + (f" - {message}" if message else "")
    return (layout.TIMED_OUT if reason == "DeadlineExceeded" else layout.FAILED), text


def record_end(view: JobView, store, *, now: float) -> str | None:
    """The run's end marker for a Job that failed without the trainer's (a deadline's pods are killed before
    they can write one): create-if-absent, so a trainer's own marker, written first, wins. Returns the marker
    the run ends with, or None while it has none. The managed rooms' own writer (schedulers' write_end)."""
    from types import SimpleNamespace

    from schedulers.sagemaker import write_end

    return write_end(SimpleNamespace(name=f"job/{JOB_NAME}"), store=store, now=now, details=view.to_json(),
                     end_of=lambda _job, stop_requested: end_of(view, stop_requested=stop_requested))


def stack_target(stack: str | None, *, stacks_dir: Path | None = None):
    """What `ops status` reads a Job stack's Job with: (client, namespace); a one-line note when its cluster cannot
    be reached; None for any other stack (whose stack file, if it cannot be read, is no Job stack's either)."""
    try:
        settings = job_stack_settings(stack, stacks_dir)
    except Exception:  # noqa: BLE001 - an unreadable stack file is reported by the commands that need it
        return None
    if settings is None:
        return None
    from components.kubernetes.stack import namespace_name

    try:
        return stack_client(settings, stack), namespace_name(settings)
    except Exception as e:  # noqa: BLE001 - the client and the pulumi CLI raise many types; each is one line
        return _not_read(e)


def _not_read(e: Exception) -> str:
    return f"job {JOB_NAME}: not read: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def read_job(target) -> tuple[JobView | None, str]:
    """(the Job, "") or (None, why it was not read) for a `stack_target`'s (client, namespace) or note."""
    if isinstance(target, str):
        return None, target
    try:
        return job_view(*target), ""
    except Exception as e:  # noqa: BLE001 - the client raises many types; each is one line beside the run's status
        return None, _not_read(e)


def status_lines_for_stack(stack: str | None, *, stacks_dir: Path | None = None, client=None) -> list[str]:
    """`ops status --stack NAME` on a Job stack: the Job's lines (`JobView.lines`), or one line saying why it
    was not read (the run folder's status stands alone then); none for any other stack."""
    try:
        target = _job_stack(stack, stacks_dir, client)
        return [] if target is None else job_view(*target).lines()
    except Exception as e:  # noqa: BLE001 - the client raises many types; each is one line beside the run's status
        return [_not_read(e)]


def logs_for_stack(stack: str | None, *, tail_lines: int | None = None, stacks_dir: Path | None = None,
                   client=None) -> list[tuple[str, str]] | None:
    """`ops logs --stack NAME` on a Job stack: each pod's trainer log (`logs`); None for any other stack."""
    target = _job_stack(stack, stacks_dir, client)
    return None if target is None else logs(*target, tail_lines=tail_lines)


def follow_for_stack(stack: str | None, out, *, tail_lines: int | None = None, stacks_dir: Path | None = None,
                     client=None, sleep=time.sleep) -> str | None:
    """`ops logs --stack NAME --follow` on a Job stack: its newest pod's trainer log until that pod ends (`follow`);
    None for any other stack."""
    target = _job_stack(stack, stacks_dir, client)
    return None if target is None else follow(*target, out, tail_lines=tail_lines, sleep=sleep)


def cmd_serve(args: argparse.Namespace) -> int:
    """``ops serve``: serve a Job stack's COMPLETE run with tensorflow/serving (`serve`)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from components.settings import ConfigError
    from ops import cli, hosts, synth
    from runfolder.storage import open_store

    try:
        settings = synth.load_source(Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml").settings
        if settings.kubernetes is None:
            raise ConfigError("scheduler", "ops serve serves a Job stack's run; this stack's scheduler is "
                              f"{settings.scheduler}, not kubernetes")
        uri = cli.run_uri(args)
        trained, version, done = serve(settings, open_store(uri), stack_client(settings, args.stack), run_uri=uri)
    except (ConfigError, hosts.HostsError, synth.ProgramError, ConfigException, OSError) as e:
        print(f"ops serve: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ApiException as e:
        print(f"ops serve: the cluster refused: {e.status} {e.reason}", file=sys.stderr)
        return EXIT_ERROR
    except HTTPError as e:  # no answer: connection refused, a timeout, a bad certificate
        print(f"ops serve: the cluster did not answer: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
              file=sys.stderr)
        return EXIT_ERROR
    print(f"published {uri}/serving/{version}/ (TensorFlow {trained}); " +
          ", ".join(f"{what} {kind}/{name}" for kind, name, what in done))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to ``python -m ops``."""
    from ops import synth

    p = sub.add_parser("serve", help="serve a Job stack's COMPLETE run with tensorflow/serving of its TF version")
    p.add_argument("--stack", required=True, help="stack name: its settings (serve, kubernetes.context)")
    p.add_argument("--run-uri", help="the run folder (default: the stack's runUri output, through the pulumi CLI)")
    p.add_argument("--stacks-dir", default=str(synth.STACKS_DIR), help="folder of the stack files (default: %(default)s)")
    p.set_defaults(func=cmd_serve)

"""`llmtrain submit | status | watch | logs | delete | list`: LLMTrainingJobs on a cluster.

kubectl's conventions: the kubeconfig's current context and its namespace unless `--kubeconfig`,
`--context` or `-n` say otherwise, and the same verbs work as the kubectl plugin
(`kubectl llmtrain list`, the `kubectl-llmtrain` entry point). The API is reached through the
operator's REST adapter (operator/kube.py) with the `kubernetes` client's kubeconfig loading, as
`upload` does; what is printed comes from jobs_view.py, which has no I/O.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from llmtrain import jobs_view
from llmtrain.constants import (
    API_GROUP,
    API_VERSION,
    DEFAULT_TRAINER_IMAGE,
    GROUP_VERSION,
    JOB_LABEL,
    KIND,
    PLURAL,
    SAVED_LOGS_DIR,
)

if TYPE_CHECKING:
    from llmtrain.operator.kube import Kube

FIELD_MANAGER = "llmtrain-cli"
APPLY_PATCH = "application/apply-patch+yaml"
RESYNC_SECONDS = 30
"""A watch ends after this long and the job is read again: a missed event costs at most this."""
LOG_ROLES = ("submitter", "head", "worker")


class CliError(RuntimeError):
    """A refusal the user can act on; printed as `llmtrain VERB: error: MESSAGE`, exit 1."""


class Session:
    """The cluster a verb talks to: an API client from the kubeconfig, and the namespace."""

    def __init__(self, args: argparse.Namespace) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:
            raise CliError(
                "the cluster verbs need the operator extra: pip install 'llmtrain[operator]'"
            ) from exc
        from llmtrain.operator.kube import RESOURCES, Kube

        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=args.kubeconfig, context=args.context, client_configuration=configuration
            )
            contexts, active = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise CliError(f"cannot load the kubeconfig: {exc}") from exc
        chosen = next((c for c in contexts if c["name"] == args.context), active) if args.context else active
        self.namespace: str = (
            args.namespace or (chosen or {}).get("context", {}).get("namespace") or "default"
        )
        self.api = client.ApiClient(configuration)
        self.kube: Kube = Kube(self.api)
        self.jobs = RESOURCES[(GROUP_VERSION, KIND)]
        self.pods = RESOURCES[("v1", "Pod")]

    def get_job(self, name: str) -> dict[str, Any]:
        from llmtrain.operator.kube import ApiError

        try:
            return self.kube.get(self.jobs, self.namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                raise CliError(f"LLMTrainingJob {self.namespace}/{name} not found") from exc
            raise


def _now() -> datetime:
    return datetime.now(UTC)


def _validated(path: Path) -> dict[str, Any]:
    """The file's one LLMTrainingJob, checked as `validate` checks it; other documents (a Secret
    beside it) are skipped with a note, as `validate`, `render` and `run` skip them."""
    from llmtrain import advice, cli

    try:
        bodies = list(cli._documents(path))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise CliError(f"{path}: cannot read: {exc}") from exc
    cli._job_documents(path, bodies)  # its notes on the other documents, as validate prints them
    try:
        document = advice.the_job(bodies, verb="llmtrain submit applies")
    except advice.NotOneJob as exc:
        raise CliError(f"{path}: {exc}") from exc
    if not cli.check_document(document.where(path), document.body, estimate_to=sys.stderr):
        raise CliError(f"{path}: not submitted; fix the fields above (llmtrain validate {path})")
    doc = document.body
    assert isinstance(doc, dict)
    return doc


def _check_allowed_secrets(session: Session, doc: dict[str, Any]) -> None:
    """Refuse, before applying, a job whose pods read a Secret its namespace does not allow
    (`llmtrain.dev/allowed-secrets`). A user who may not read the Namespace (it is cluster-scoped)
    is not stopped: the operator then reports the policy's refusal in the job's status."""
    from llmtrain import advice
    from llmtrain.api.validation import parse_job
    from llmtrain.operator.kube import ApiError
    from llmtrain.render import render

    wanted = advice.secrets_reaching_pods(render(parse_job(doc)))
    if not wanted:
        return
    try:
        namespace = session.kube.request("GET", f"/api/v1/namespaces/{session.namespace}")
    except ApiError as exc:
        if exc.status in (401, 403, 404):
            return
        raise
    refusal = advice.secrets_refusal(session.namespace, wanted, namespace["metadata"].get("annotations"))
    if refusal:
        raise CliError(f"not submitted: {refusal}")


def cmd_submit(args: argparse.Namespace) -> int:
    doc = _validated(args.file)
    session = Session(args)
    meta = doc.setdefault("metadata", {})
    if args.namespace and meta.get("namespace") not in (None, args.namespace):
        raise CliError(f"the file's namespace {meta['namespace']!r} does not match -n {args.namespace!r}")
    namespace = meta.setdefault("namespace", session.namespace)
    session.namespace = namespace
    name = meta["name"]
    _check_allowed_secrets(session, doc)
    # Server-side apply: create or update, and the fields this CLI set are owned by it, so a later
    # `submit` of an edited file removes what the edit removed (as `kubectl apply` does).
    session.kube.request(
        "PATCH",
        session.jobs.path(namespace, name)
        + f"?fieldManager={FIELD_MANAGER}&force=true&fieldValidation=Strict",
        doc,
        APPLY_PATCH,
    )
    print(f"llmtrainingjob.{API_GROUP}/{name} submitted to namespace {namespace}", file=sys.stderr)
    if args.no_follow:
        return 0
    return _follow(session, name)


def _events(session: Session, name: str, resource_version: str) -> Iterator[dict[str, Any]]:
    """The job's versions from one watch, until the server ends it (after RESYNC_SECONDS)."""
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(session.api)
    stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
        custom.list_namespaced_custom_object,
        API_GROUP,
        API_VERSION,
        session.namespace,
        PLURAL,
        field_selector=f"metadata.name={name}",
        resource_version=resource_version,
        timeout_seconds=RESYNC_SECONDS,
    )
    for event in stream:
        if event["type"] == "DELETED":
            raise CliError(f"LLMTrainingJob {session.namespace}/{name} was deleted")
        if event["type"] in ("ADDED", "MODIFIED"):
            yield event["object"]


def _follow(session: Session, name: str, out: Any = None) -> int:
    """Print progress until the job ends: one redrawn line on a terminal, a line per change
    otherwise (CI, `tee`); the exit code says how it ended."""
    from kubernetes.client.exceptions import ApiException

    out = out or sys.stdout
    tty = out.isatty()
    last = ""

    def show(job: dict[str, Any]) -> None:
        nonlocal last
        line = jobs_view.progress_line(job)
        if line == last:
            return
        if tty:
            out.write("\r\033[K" + line)
        else:
            out.write(line + "\n")
        out.flush()
        last = line

    try:
        while True:
            job = session.get_job(name)  # the resync: a fresh read, whatever the watch missed
            show(job)
            if jobs_view.is_terminal(job):
                break
            try:
                for job in _events(session, name, job["metadata"]["resourceVersion"]):  # noqa: B020
                    show(job)
                    if jobs_view.is_terminal(job):
                        break
            except ApiException as exc:  # 410 Gone and friends: read again and watch anew
                if exc.status not in (410, 500, 503, 504):
                    raise
                time.sleep(1)
            if jobs_view.is_terminal(job):
                break
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
        return 130
    if tty:
        out.write("\n")
    message = (job.get("status") or {}).get("message")
    if message:
        print(f"{jobs_view.phase(job)}: {message}", file=sys.stderr)
    return jobs_view.exit_code(job)


def cmd_status(args: argparse.Namespace) -> int:
    session = Session(args)
    job = session.get_job(args.name)
    if args.output == "json":
        sys.stdout.write(json.dumps(job.get("status") or {}, indent=2) + "\n")
    else:
        sys.stdout.write(jobs_view.status_text(job, _now()))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    return _follow(Session(args), args.name)


def cmd_list(args: argparse.Namespace) -> int:
    session = Session(args)
    namespace = None if args.all_namespaces else session.namespace
    jobs = session.kube.list_all(session.jobs, namespace)
    if not jobs:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        print(f"No LLMTrainingJobs in {where}.", file=sys.stderr)
        return 0
    sys.stdout.write(jobs_view.list_table(jobs, _now(), all_namespaces=namespace is None))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from llmtrain.operator.kube import ApiError
    from llmtrain.render.names import pvc_name

    session = Session(args)
    job = session.get_job(args.name)
    try:
        session.kube.request("DELETE", session.jobs.path(session.namespace, args.name))
    except ApiError as exc:
        if exc.status == 404:
            raise CliError(f"LLMTrainingJob {session.namespace}/{args.name} not found") from exc
        raise
    print(f'llmtrainingjob.{API_GROUP} "{args.name}" deleted')
    print(jobs_view.storage_after_delete(job, pvc_name(args.name)))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    refusal = saved_logs_refusal(args)
    if refusal:
        raise CliError(refusal)
    session = Session(args)
    job = session.get_job(args.name)  # a clear "not found" for a typo, rather than "no pods"
    if args.saved:
        return _print_saved_logs(session, job, args)
    role = "worker" if args.worker is not None else ("head" if args.head else "submitter")
    pods = session.kube.list_all(session.pods, session.namespace, label_selector=f"{JOB_LABEL}={args.name}")
    try:
        pod = jobs_view.select_pod(pods, role, args.worker)
    except jobs_view.PodNotFound as exc:
        hint = jobs_view.saved_logs_hint(args.name, args.worker) if not pods else ""
        raise CliError(f"LLMTrainingJob {session.namespace}/{args.name}: {exc}{hint}") from exc
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]["name"]
    print(f"==> pod {name} ({role}), container {container}", file=sys.stderr)
    _stream_log(session, name, container, follow=args.follow, tail=args.tail)
    return 0


def saved_logs_refusal(args: argparse.Namespace) -> str | None:
    """What `--saved` cannot be combined with: the files are read once, and the head has none."""
    if not args.saved:
        return None
    if args.head:
        return "--saved has the driver's log (the default) and each rank's (--worker N); the head saves none"
    if args.follow:
        return "--saved prints the saved files as they are; --follow needs a live pod (drop --saved)"
    return None


def _print_saved_logs(session: Session, job: dict[str, Any], args: argparse.Namespace) -> int:
    """The files the trainer appended to `<run dir>/logs/`, read by a short-lived pod that mounts
    the job's claim read-only (the upload pod's shape: restricted Pod Security, the Ray pods' UID
    and fsGroup), then deleted."""
    from kubernetes import client

    from llmtrain.api.validation import InvalidJob, parse_job
    from llmtrain.render.storage import claim_name
    from llmtrain.render.trainer_config import run_id, runs_root
    from llmtrain.upload import Target, Uploader, UploadError

    try:
        parsed = parse_job(job)
    except InvalidJob as exc:
        raise CliError(f"LLMTrainingJob {session.namespace}/{args.name}: {exc}") from exc
    mount = parsed.spec.storage.mount_path
    logs = runs_root(parsed) / parsed.metadata.name / run_id(parsed) / SAVED_LOGS_DIR
    wanted = jobs_view.saved_log_name(args.worker)
    image = args.image or parsed.spec.resources.image or DEFAULT_TRAINER_IMAGE
    target = Target(session.namespace, claim_name(parsed), PurePosixPath("."))
    reader = Uploader(client.CoreV1Api(session.api), log=lambda line: print(line, file=sys.stderr))
    try:
        listing, text = reader.read_files(target, image, mount, str(logs), wanted, tail=args.tail)
    except UploadError as exc:
        raise CliError(str(exc)) from exc
    if wanted not in listing:
        raise CliError(jobs_view.no_saved_log(f"{session.namespace}/{args.name}", str(logs), wanted, listing))
    print(f"==> {logs}/{wanted} on claim {target.claim} (saved by the trainer)", file=sys.stderr)
    others = [f for f in listing if f != wanted]
    if others:
        print(f"    also saved: {', '.join(others)}", file=sys.stderr)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _stream_log(session: Session, pod: str, container: str, *, follow: bool, tail: int | None) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(session.api)
    try:
        response: Any = core.read_namespaced_pod_log(
            pod,
            session.namespace,
            container=container,
            follow=follow,
            tail_lines=tail,
            _preload_content=False,
        )
    except ApiException as exc:
        body = (exc.body or b"").decode() if isinstance(exc.body, bytes) else str(exc.body or "")
        try:
            detail = json.loads(body).get("message", body)
        except ValueError:
            detail = body
        raise CliError(f"cannot read the logs of pod {pod}: {detail or exc.reason}") from exc
    try:
        for chunk in response.stream(4096, decode_content=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        response.release_conn()


def _cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")


def _guarded(func: Callable[[argparse.Namespace], int], verb: str) -> Callable[[argparse.Namespace], int]:
    """Refusals and API errors as one line on stderr, exit 1, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        from llmtrain.operator.kube import ApiError

        try:
            return func(args)
        except (CliError, ApiError) as exc:
            print(f"llmtrain {verb}: error: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(sub: Any) -> None:
    """The cluster verbs, as subcommands of `llmtrain` (and of `kubectl llmtrain`)."""
    p = sub.add_parser(
        "submit",
        help="validate an LLMTrainingJob file, apply it to the cluster and follow it",
        description="Validate FILE as `llmtrain validate` does (nothing is created if it fails), "
        "apply it (server-side apply: creates or updates), then follow its progress until it ends. "
        "Exits 0 when the job succeeded, 1 when it failed.",
    )
    p.add_argument("file", type=Path, help="LLMTrainingJob YAML file ('-' for stdin)")
    p.add_argument("--no-follow", action="store_true", help="return once the job is applied")
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_submit, "submit"))

    p = sub.add_parser("status", help="a job's phase, progress, conditions and why it waits, if it does")
    p.add_argument("name")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_status, "status"))

    p = sub.add_parser(
        "watch",
        help="a live progress bar until the job ends (exit 0 on Succeeded, 1 on Failed)",
    )
    p.add_argument("name")
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_watch, "watch"))

    p = sub.add_parser(
        "logs",
        help="the trainer's logs: the submitter pod's (default), the head's or a worker's",
        description="Print the logs of one of the job's pods: the submitter (the Ray job's driver "
        "output, the default), the Ray head (--head) or worker N (--worker N, in name order). "
        "With --saved, the files the trainer appended to <run dir>/logs on the job's storage, which "
        "outlive the pods: the driver's (default) or training rank N's (--worker N).",
    )
    p.add_argument("name")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--head", action="store_true", help="the Ray head pod")
    which.add_argument("--worker", type=int, metavar="N", help="worker pod N (0-based, in name order)")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming new lines")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument(
        "--saved",
        action="store_true",
        help="the logs the trainer saved in its run directory (they outlive the pods): the driver's, "
        "or rank N's with --worker N; read by a short-lived pod that mounts the job's claim read-only",
    )
    p.add_argument(
        "--image",
        help="image of the --saved reader pod (needs sh, ls, tail; default: the job's trainer image)",
    )
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_logs, "logs"))

    p = sub.add_parser(
        "delete",
        help="delete a job and its Ray cluster; says whether its storage is kept (storage.create.reclaim)",
    )
    p.add_argument("name")
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_delete, "delete"))

    p = sub.add_parser("list", help="the jobs of a namespace with phase, progress, loss and ETA")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    _cluster_flags(p)
    p.set_defaults(func=_guarded(cmd_list, "list"))

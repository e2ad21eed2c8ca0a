"""`llmtrain`: render, validate and run LLMTrainingJobs without a cluster; start the operator;
submit, follow and read jobs on a cluster (jobs_cli.py).

Subcommands import heavy dependencies (Ray, torch, Kopf) lazily, so `render` and `validate` stay
fast and work with only the core install.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TextIO

import yaml

from llmtrain import advice, jobs_cli, memory, plain_yaml
from llmtrain.api import manifest_yaml
from llmtrain.api.crd import crd_yaml
from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.validation import InvalidJob, Problem, parse_job
from llmtrain.constants import DEFAULT_TRAINER_IMAGE, KIND, LOCAL_RUNS_DIR, VERSION
from llmtrain.operator import config as operator_config

TRAINERS_GROUP = "llmtrain.trainers"
"""The entry point group the trainer package registers its runners in (see pyproject.toml)."""
LOCAL_TRAINER = "local"
"""The runner behind `llmtrain run`: `run_local(job_file, runs_root, use_gpu, fresh[, ray]) -> exit code`."""


def _documents(path: Path) -> Iterator[Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    for doc in manifest_yaml.load_all(text):
        if doc is not None:
            yield doc


def _job_documents(path: Path, bodies: list[Any]) -> list[advice.Document]:
    """The file's LLMTrainingJob documents; a note on stderr for each other document skipped."""
    jobs, notes = advice.job_documents(bodies)
    for note in notes:
        print(f"{path}: note: {note}", file=sys.stderr)
    return jobs


def _accelerator_warning(where: Path | str, job: LLMTrainingJob) -> None:
    warning = advice.accelerator_warning(job.spec.resources)
    if warning:
        print(f"{where}: {job.metadata.name}: warning: {warning}", file=sys.stderr)


def _dump(objects: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return "".join("---\n" + plain_yaml.dump(o) for o in objects)


def cmd_render(args: argparse.Namespace) -> int:
    from llmtrain.render import ImageSettings, render

    try:
        bodies = list(_documents(args.file))
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.file}: cannot read: {exc}", file=sys.stderr)
        return 1
    documents = _job_documents(args.file, bodies)
    if not documents:
        print(f"{args.file}: no {KIND} among its {len(bodies)} document(s)", file=sys.stderr)
        return 1
    jobs: list[tuple[str, LLMTrainingJob]] = []
    for document in documents:
        try:
            jobs.append((document.where(args.file), parse_job(document.body)))
        except InvalidJob as exc:
            _print_problems(document.where(args.file), exc.problems)
    if len(jobs) < len(documents):
        return 1
    images = ImageSettings(trainer_image=args.trainer_image) if args.trainer_image else ImageSettings()
    for where, job in jobs:
        _accelerator_warning(where, job)
    sys.stdout.write(_dump([o for _, job in jobs for o in render(job, images)], args.output))
    return 0


def _print_problems(path: Path | str, problems: list[Problem]) -> None:
    for problem in problems:
        print(f"{path}: {problem}", file=sys.stderr)


def check_document(where: Path | str, doc: Any, estimate_to: TextIO | None = None) -> bool:
    """One document as the API server would see it, plus the accelerator label and the memory fit:
    problems and warnings go to stderr, the estimate of a job that fits to stdout. `validate` runs
    it on every job document, `submit` on the one it applies (its estimate to stderr: its stdout is
    the job's progress)."""
    try:
        job = parse_job(doc)
    except InvalidJob as exc:
        _print_problems(where, exc.problems)
        return False
    _accelerator_warning(where, job)
    plan = memory.Plan.of_job(job.spec)
    findings = memory.check(plan)
    for finding in findings:
        kind = "error" if finding.error else "warning"
        print(f"{where}: {job.metadata.name}: memory {kind}: {finding.message}", file=sys.stderr)
    if not findings:
        print(f"{where}: {job.metadata.name}: memory: {memory.summary(plan)}", file=estimate_to or sys.stdout)
    return not any(finding.error for finding in findings)


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            docs = list(_documents(path))
        except (OSError, yaml.YAMLError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            failed = True
            continue
        if not docs:
            print(f"{path}: no document found", file=sys.stderr)
            failed = True
        documents = _job_documents(path, docs)
        if docs and not documents:
            print(f"{path}: no {KIND} among its {len(docs)} document(s)", file=sys.stderr)
            failed = True
        for document in documents:
            failed = not check_document(document.where(path), document.body) or failed
    if not failed:
        print(f"{len(args.files)} file(s) valid")
    return 1 if failed else 0


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml())
    return 0


class TrainerNotInstalled(RuntimeError):
    """`llmtrain run` found no trainer to run: an install without the train extra."""


def local_trainer() -> Callable[..., int]:
    """The trainer's local runner, looked up through its entry point (loading imports the trainer)."""
    found = entry_points(group=TRAINERS_GROUP, name=LOCAL_TRAINER)
    if not found:
        raise TrainerNotInstalled(f"no {LOCAL_TRAINER!r} entry point in group {TRAINERS_GROUP!r}")
    entry_point = next(iter(found))
    try:
        runner: Callable[..., int] = entry_point.load()
    except ImportError as exc:  # declared (same distribution) but the trainer or its deps are missing
        raise TrainerNotInstalled(str(exc)) from exc
    return runner


def _run_notes(path: Path, use_gpu: bool) -> list[str]:
    """What to say before a local run starts (the runner reports an unreadable file itself)."""
    try:
        bodies = [] if str(path) == "-" else list(_documents(path))
    except (OSError, yaml.YAMLError):
        return []
    return [f"{path}: {line}" for line in advice.run_notes(bodies, use_gpu)]


def cmd_run(args: argparse.Namespace) -> int:
    for line in _run_notes(args.file, args.gpu):
        print(line, file=sys.stderr)
    try:
        run_local = local_trainer()
    except TrainerNotInstalled as exc:
        print(
            f"llmtrain run needs the trainer, which this install lacks; install the train extra: "
            f"pip install 'llmtrain[train]' ({exc})",
            file=sys.stderr,
        )
        return 2
    if args.no_ray:
        return run_local(args.file, runs_root=args.runs_dir, use_gpu=args.gpu, fresh=args.fresh, ray=False)
    return run_local(args.file, runs_root=args.runs_dir, use_gpu=args.gpu, fresh=args.fresh)


def cmd_upload(args: argparse.Namespace) -> int:
    """Copy a local folder onto a claim (or a job's claim) through a short-lived pod."""
    try:
        from kubernetes import client, config
    except ImportError:
        print("llmtrain upload needs the operator extra: pip install 'llmtrain[operator]'", file=sys.stderr)
        return 2
    from llmtrain.upload import Uploader, UploadError, default_namespace, target_for

    config.load_kube_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api()
    namespace = args.namespace or default_namespace()
    uploader = Uploader(core, log=lambda line: print(line, file=sys.stderr))
    try:
        if args.claim is not None:
            uploader.ensure_claim(namespace, args.claim, args.size, args.storage_class)
        target = target_for(namespace, args.claim, args.job, args.to, core)
        uploader.upload(args.source, target, args.image, timeout=args.timeout)
    except UploadError as exc:
        print(f"llmtrain upload: error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    try:
        config = operator_config.from_args(args)
    except operator_config.ConfigError as exc:
        print(f"llmtrain operator: {exc}", file=sys.stderr)
        return 2
    try:
        from llmtrain.operator.main import run_operator
    except ImportError as exc:
        print(
            f"llmtrain operator needs the operator extra: pip install 'llmtrain[operator]' ({exc})",
            file=sys.stderr,
        )
        return 2
    return run_operator(config)


def build_parser(prog: str = "llmtrain") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Train LLMs on Kubernetes with one kubectl apply."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="print the Kubernetes objects an LLMTrainingJob becomes")
    p.add_argument("file", type=Path, help="LLMTrainingJob YAML file ('-' for stdin)")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.add_argument("--trainer-image", help="trainer image (default: the release's image)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("validate", help="check LLMTrainingJob files as the API server would")
    p.add_argument("files", type=Path, nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print the LLMTrainingJob CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("run", help="train an LLMTrainingJob on this machine with a local Ray (or --no-ray)")
    p.add_argument("file", type=Path)
    p.add_argument("--runs-dir", type=Path, default=Path(LOCAL_RUNS_DIR), help="where runs are kept")
    p.add_argument("--gpu", action="store_true", help="train on local GPUs (default: CPU)")
    p.add_argument("--fresh", action="store_true", help="discard the previous run and start over")
    p.add_argument(
        "--no-ray",
        action="store_true",
        help="train without Ray: one process (python -m llmtrain_trainer.launch), or torchrun's "
        "processes, one per worker, when the job has more; no worker restarts (run again to resume); "
        "trainer.type huggingface needs Ray",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "upload",
        help="copy a local file or folder onto a job's shared storage (through a short-lived pod)",
        description="Copy SOURCE onto a PersistentVolumeClaim, under --to, through a short-lived "
        "pod that mounts it (restricted Pod Security, the Ray pods' user). Use it to put a "
        "dataset or a model where a job's dataset.path / model.name find them.",
    )
    p.add_argument("source", type=Path, help="local file or folder")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--claim", help="the claim to copy to (created, ReadWriteMany, with --size)")
    where.add_argument("--job", help="the claim an existing LLMTrainingJob mounts")
    p.add_argument("--to", default=".", help="folder inside the claim (relative; default: its root)")
    p.add_argument("--size", help="create --claim with this size if it does not exist, e.g. 10Gi")
    p.add_argument("--storage-class", help="StorageClass of a created claim (default: the cluster's)")
    p.add_argument(
        "--image", default=DEFAULT_TRAINER_IMAGE, help="image of the upload pod (needs sh, tar, find)"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the pod to run")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("operator", help="run the Kubernetes operator")
    operator_config.add_arguments(p)
    p.set_defaults(func=cmd_operator)

    jobs_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "llmtrain") -> int:
    args = build_parser(prog).parse_args(argv)
    code: int = args.func(args)
    return code


def kubectl_plugin() -> int:
    """`kubectl llmtrain ...`: kubectl runs the `kubectl-llmtrain` executable with the rest of the
    command line, so the plugin is the same CLI under kubectl's name."""
    return main(prog="kubectl llmtrain")


if __name__ == "__main__":
    raise SystemExit(main())

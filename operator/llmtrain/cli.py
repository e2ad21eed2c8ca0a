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
from typing import Any

import yaml

from llmtrain import jobs_cli, memory, plain_yaml
from llmtrain.api import manifest_yaml
from llmtrain.api.crd import crd_yaml
from llmtrain.api.validation import InvalidJob, Problem, parse_job
from llmtrain.constants import DEFAULT_TRAINER_IMAGE, LOCAL_RUNS_DIR, VERSION
from llmtrain.operator import config as operator_config

TRAINERS_GROUP = "llmtrain.trainers"
"""The entry point group the trainer package registers its runners in (see pyproject.toml)."""
LOCAL_TRAINER = "local"
"""The runner behind `llmtrain run`: `run_local(job_file, runs_root, use_gpu, fresh) -> exit code`."""


def _documents(path: Path) -> Iterator[Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    for doc in manifest_yaml.load_all(text):
        if doc is not None:
            yield doc


def _load_one(path: Path) -> Any:
    docs = list(_documents(path))
    if len(docs) != 1:
        raise InvalidJob(
            [Problem(".", f"{path} holds {len(docs)} documents; give one LLMTrainingJob per file")]
        )
    return docs[0]


def _dump(objects: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return "".join("---\n" + plain_yaml.dump(o) for o in objects)


def cmd_render(args: argparse.Namespace) -> int:
    from llmtrain.render import ImageSettings, render

    try:
        job = parse_job(_load_one(args.file))
    except InvalidJob as exc:
        _print_problems(args.file, exc.problems)
        return 1
    images = ImageSettings(trainer_image=args.trainer_image) if args.trainer_image else ImageSettings()
    sys.stdout.write(_dump(render(job, images), args.output))
    return 0


def _print_problems(path: Path, problems: list[Problem]) -> None:
    for problem in problems:
        print(f"{path}: {problem}", file=sys.stderr)


def check_document(path: Path, doc: Any) -> bool:
    """One document as the API server would see it, plus the memory fit; problems go to stderr.
    `validate` runs it on every document, `submit` on the one it applies."""
    try:
        job = parse_job(doc)
    except InvalidJob as exc:
        _print_problems(path, exc.problems)
        return False
    ok = True
    for finding in memory.check(memory.Plan.of_job(job.spec)):
        kind = "error" if finding.error else "warning"
        print(f"{path}: {job.metadata.name}: memory {kind}: {finding.message}", file=sys.stderr)
        ok = ok and not finding.error
    return ok


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
        for doc in docs:
            failed = not check_document(path, doc) or failed
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


def cmd_run(args: argparse.Namespace) -> int:
    try:
        run_local = local_trainer()
    except TrainerNotInstalled as exc:
        print(
            f"llmtrain run needs the trainer, which this install lacks; install the train extra: "
            f"pip install 'llmtrain[train]' ({exc})",
            file=sys.stderr,
        )
        return 2
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

    p = sub.add_parser("run", help="train an LLMTrainingJob on this machine with a local Ray")
    p.add_argument("file", type=Path)
    p.add_argument("--runs-dir", type=Path, default=Path(LOCAL_RUNS_DIR), help="where runs are kept")
    p.add_argument("--gpu", action="store_true", help="train on local GPUs (default: CPU)")
    p.add_argument("--fresh", action="store_true", help="discard the previous run and start over")
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

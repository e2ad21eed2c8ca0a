"""`llmtrain run FILE`: the job's training on a local Ray instance, with a live progress bar.

With `--no-ray` (`ray=False`) the same run goes through launch.py instead: one process, or with
torchrun one per worker when the job has more; nothing of Ray is needed or imported.

The run lives in `<runs_root>/<name>/<job file stem>/` and uses the same TrainerConfig, driver and
worker loop as the cluster, so running the same file again resumes from the latest checkpoint (and
a finished run just prints its summary; `fresh=True` starts over). At the end it writes `summary.json` and
`loss_curve.png` into the run directory. Text from elsewhere (errors, paths, names) is escaped
before rich prints it: a gloo error starts with `[/path/file.cc:129]`, which rich reads as markup.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from llmtrain.advice import NotOneJob, the_job
from llmtrain.api import manifest_yaml
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.constants import LOCAL_RUNS_DIR
from llmtrain.render.trainer_config import local_trainer_config
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from llmtrain_trainer.progress import read_records, step_history
from llmtrain_trainer.progress_bar import ConsoleProgress
from llmtrain_trainer.rundir import (
    LOSS_CURVE_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    RunResult,
    latest_checkpoint,
)


def load_job_config(job_file: Path, runs_root: Path, use_gpu: bool) -> TrainerConfig:
    """Parse and validate the LLMTrainingJob file into this machine's TrainerConfig."""
    try:
        # Typed as kubectl would send it, for parse_job's strict (API-server) types.
        bodies = [d for d in manifest_yaml.load_all(job_file.read_text(encoding="utf-8")) if d is not None]
    except OSError as exc:
        raise InvalidJobFile(f"cannot read {job_file}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise InvalidJobFile(f"{job_file} is not valid YAML: {exc}") from exc
    try:
        # The other documents (a Secret beside the job) are skipped, as validate and render do.
        document = the_job(bodies)
    except NotOneJob as exc:
        raise InvalidJobFile(f"{job_file} {exc}") from exc
    try:
        job = parse_job(document.body)
    except InvalidJob as exc:
        raise InvalidJobFile(
            f"{document.where(job_file)} is not a valid LLMTrainingJob:\n"
            + "\n".join(f"  {p}" for p in exc.problems)
        ) from exc
    # The job file is the local run's identity: the same file resumes, another file starts anew.
    config = local_trainer_config(
        job, job_file.parent, runs_root, use_gpu=use_gpu, local_run_id=job_file.stem
    )
    from llmtrain_trainer.weights import with_model_folder  # imports torch: only once the file is valid

    return with_model_folder(config)


NO_RAY_HELP = (
    "train without Ray (python -m llmtrain_trainer.launch): one process on this machine, or with "
    "torchrun one per worker when the job has more; no worker restarts, run again to resume"
)


class InvalidJobFile(ValueError):
    """The job file cannot be read or is not a valid LLMTrainingJob."""


def is_finished(config: TrainerConfig, result: RunResult | None) -> bool:
    """Finished, and for the same step count (raising maxSteps continues the run instead)."""
    if result is None or not result.finished:
        return False
    return config.training.max_steps is None or result.steps == config.training.max_steps


def build_summary(run_dir: Path, wall_seconds: float | None) -> dict[str, Any]:
    """summary.json: losses from the metrics file, the rest from the trainer's result.json."""
    history = step_history(read_records(run_dir / METRICS_FILE))
    result = RunResult.read(run_dir)
    export = result.export if result else None
    merged = Path(export) / "merged" if export else None
    return {
        "run_dir": str(run_dir),
        "initial_loss": history[0].loss if history else None,
        "final_loss": history[-1].loss if history else None,
        "steps": result.steps if result else (history[-1].step if history else 0),
        "tokens_per_second": result.tokens_per_second if result else None,
        "resumed_from_step": result.resumed_from_step if result else None,
        "checkpoint": result.checkpoint if result else None,
        "export": export,
        "merged_export": str(merged) if merged and merged.exists() else None,
        "loss_curve": str(run_dir / LOSS_CURVE_FILE),
        "wall_seconds": wall_seconds,
    }


def plot_loss_curve(run_dir: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_records(run_dir / METRICS_FILE)
    history = step_history(records)
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    points = [(r.step, r.loss) for r in history if r.loss is not None]
    axes.plot([s for s, _ in points], [loss for _, loss in points], marker=".", label="training loss")
    validation = {r.step: r.val_loss for r in records if r.event == "validation" and r.val_loss is not None}
    if validation:
        axes.plot(
            list(validation), list(validation.values()), marker="o", linestyle="--", label="validation loss"
        )
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.set_title(run_dir.name)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    title = f"llmtrain run summary: {escape(Path(summary['run_dir']).name)}"
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.4f}" if abs(value) < 100 else f"{value:,.0f}"
        return "-" if value is None else str(value)

    for key in (
        "initial_loss",
        "final_loss",
        "steps",
        "tokens_per_second",
        "resumed_from_step",
        "wall_seconds",
        "checkpoint",
        "export",
        "merged_export",
        "loss_curve",
    ):
        if key in summary and (summary[key] is not None or key in ("resumed_from_step",)):
            table.add_row(key, Text(fmt(summary[key])))
    console.print(table)


def run_local(
    job_file: Path,
    runs_root: Path = Path(LOCAL_RUNS_DIR),
    use_gpu: bool = False,
    fresh: bool = False,
    ray: bool = True,
) -> int:
    """Train the job on a local Ray instance (or without Ray: launch.py); returns the exit code."""
    console = Console()
    try:
        config = load_job_config(job_file, runs_root, use_gpu)
    except InvalidJobFile as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    run_dir = Path(config.run_dir)
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
        console.print(f"--fresh: removed {escape(str(run_dir))}; starting over")
    if is_finished(config, RunResult.read(run_dir)):
        console.print(
            f"Run [bold]{escape(config.run_name)}[/bold] already finished in {escape(str(run_dir))}; "
            "not retraining "
            "(pass --fresh to start over)."
        )
        summary_file = run_dir / SUMMARY_FILE
        summary = (
            json.loads(summary_file.read_text()) if summary_file.exists() else build_summary(run_dir, None)
        )
        print_summary(console, summary)
        return _push(console, config)  # a push that failed last time is tried again
    latest = latest_checkpoint(run_dir)
    if latest is not None:
        console.print(
            f"Resuming {escape(config.run_name)} from {escape(latest.name)} (pass --fresh to start over)."
        )
    from llmtrain_trainer.objstore import ObjectStoreError, stage_inputs

    try:  # object-storage inputs copied once to the runs' cache, with or without Ray
        config = stage_inputs(config, resuming=latest is not None)
    except ObjectStoreError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 1
    if not ray:
        return _run_without_ray(console, config, use_gpu)
    # Heavy imports (torch, transformers, Ray) only once there is training to do.
    import logging

    import ray as ray_module

    from llmtrain_trainer.loop import LoopOptions
    from llmtrain_trainer.main import TrainingError, run_training
    from llmtrain_trainer.modes import mode_for
    from llmtrain_trainer.preflight import PreflightError, check
    from llmtrain_trainer.run_logs import attach_driver, detach, logs_dir, note

    try:
        check(config)
    except PreflightError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2

    started = time.monotonic()
    workers = config.scaling.num_workers
    described = mode_for(config.trainer.type).describe(config)
    console.print(
        f"Training [bold]{escape(config.run_name)}[/bold] with {workers} {'GPU' if use_gpu else 'CPU'} "
        f"workers ({escape(described)}); run directory {escape(str(run_dir))}"
    )
    ray_module.init(
        num_cpus=max(1, int(workers * config.scaling.cpus_per_worker)),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    saved = attach_driver(run_dir)
    note(saved, f"training {config.run_name} with {workers} workers ({described})", logging.INFO)
    try:
        # Progress lines go to the workers' own logs (their saved files; Ray keeps their stderr
        # off this console), as in a pod; the console shows the progress bar.
        with ConsoleProgress(run_dir / METRICS_FILE):
            run_training(config, LoopOptions(log_lines=True))
    except TrainingError as exc:
        note(saved, f"training failed: {exc}")
        console.print(f"[red]training failed:[/red] {escape(str(exc))}", highlight=False)
        console.print(
            f"Worker logs: {escape(str(logs_dir(run_dir)))} (worker-<rank>.log). Run again to resume."
        )
        return 1
    except (KeyboardInterrupt, SystemExit):
        # Ray Train's own Ctrl-C handler aborts the run and may exit through SystemExit.
        pass
    finally:
        ray_module.shutdown()
        detach(saved)
    return _finish(console, config, started)


def _finish(console: Console, config: TrainerConfig, started: float) -> int:
    """After training: the summary of a finished run, or how to resume a stopped one."""
    run_dir = Path(config.run_dir)
    if not is_finished(config, RunResult.read(run_dir)):
        latest = latest_checkpoint(run_dir)
        where = f"from {latest.name}" if latest else "from the start (no checkpoint was written yet)"
        console.print(f"Stopped before the end; run the same command again to resume {escape(where)}.")
        return 130
    summary = build_summary(run_dir, time.monotonic() - started)
    plot_loss_curve(run_dir, run_dir / LOSS_CURVE_FILE)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(console, summary)
    return _push(console, config)


def _push(console: Console, config: TrainerConfig) -> int:
    """checkpoint.exportTo and checkpoint.pushToHub: copy the finished export to the object store
    and upload it to the Hub (each once, retried; one failing does not stop the other)."""
    from llmtrain_trainer.hubpush import push_destinations

    uri, commit, errors = push_destinations(config)
    if uri is not None:
        console.print(f"Export pushed to {escape(uri)}")
    if commit is not None:
        console.print(f"Export pushed to the Hub: {escape(commit)}")
    for error in errors:
        console.print(f"[red]error:[/red] {escape(error)}", highlight=False)
    return 1 if errors else 0


def launch_command(config_file: Path, workers: int) -> list[str]:
    """launch.py for one process, under torchrun (part of torch) for several on this machine."""
    launch = ["-m", "llmtrain_trainer.launch", "--config", str(config_file)]
    if workers == 1:
        return [sys.executable, *launch]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={workers}",
        *launch,
    ]


LAUNCH_FAILURE_MARKS = ("error:", "exitcode", "Signal ", "Error:")
"""What a failure line in launch.log holds, most telling first: launch.py's own message; torchrun's
report of a rank that died without one (its exit code, the signal that killed it); a traceback's
last line (torchrun's own failure, an exception before launch.py's handler)."""


def launch_failure(lines: list[str], code: int) -> str:
    """Why the launch failed, from its log: the last line with the most telling mark, else the code.
    A rank killed by a signal (the OOM killer) writes no message of its own, and torchrun then
    exits 1: its report names the signal."""
    for mark in LAUNCH_FAILURE_MARKS:
        if found := next((line.strip() for line in reversed(lines) if mark in line), None):
            return found
    return f"exit code {code}"


def _run_without_ray(console: Console, config: TrainerConfig, use_gpu: bool) -> int:
    """Train through launch.py in child processes, their output in logs/launch.log (each rank's
    own log is in logs/worker-N.log, as under Ray); the console shows the progress bar."""
    import subprocess

    from llmtrain_trainer.run_logs import logs_dir

    run_dir = Path(config.run_dir)
    workers = config.scaling.num_workers
    logs = logs_dir(run_dir)
    logs.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "trainer-config.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2) + "\n")
    console.print(
        f"Training [bold]{escape(config.run_name)}[/bold] without Ray: {workers} "
        f"{'GPU' if use_gpu else 'CPU'} process{'es (torchrun)' if workers > 1 else ''}; "
        f"run directory {escape(str(run_dir))}"
    )
    started = time.monotonic()
    with (logs / "launch.log").open("a") as output, ConsoleProgress(run_dir / METRICS_FILE):
        try:
            code = subprocess.call(
                launch_command(config_file, workers), stdout=output, stderr=subprocess.STDOUT
            )
        except KeyboardInterrupt:
            code = 130
    if code not in (0, 130):
        reason = launch_failure((logs / "launch.log").read_text(errors="replace").splitlines(), code)
        console.print(f"[red]training failed:[/red] {escape(reason)}", highlight=False)
        console.print(f"Logs: {escape(str(logs))} (launch.log, worker-<rank>.log). Run again to resume.")
        return 2 if code == 2 else 1
    return _finish(console, config, started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmtrain_trainer.local", description=run_local.__doc__)
    parser.add_argument("job_file", type=Path)
    parser.add_argument("--runs-dir", type=Path, default=Path(LOCAL_RUNS_DIR))
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--no-ray", action="store_true", help=NO_RAY_HELP)
    args = parser.parse_args(argv)
    return run_local(args.job_file, args.runs_dir, use_gpu=args.gpu, fresh=args.fresh, ray=not args.no_ray)


if __name__ == "__main__":
    sys.exit(main())

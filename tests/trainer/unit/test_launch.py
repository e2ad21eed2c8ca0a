"""The launch without Ray (launch.py): in processes where `import ray` fails, a run trains, keeps
checkpoint.keep checkpoints as Ray's num_to_keep would, and a second launch resumes it;
`llmtrain run --no-ray` starts one process per worker with torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.rundir import RESULT_FILE, RunResult, checkpoint_name, complete_checkpoints

from tests.support.trainer import REPO, TINY_STORIES, losses, result, run_dir, tiny_config, write_config

NO_RAY = 'import sys\nsys.modules["ray"] = None  # this machine has no Ray: any import of it fails\n'


def _run_without_ray(args: list[str], tmp_path: Path) -> None:
    """Run `args` with Ray unimportable in it and every process it starts. On failure the message
    ends with the tails of the logs it wrote (torchrun's launch.log, each rank's log)."""
    site = tmp_path / "no-ray"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_RAY)  # imported at the start of every interpreter
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        logs = sorted(tmp_path.rglob("*.log"))
        tails = [f"--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in logs]
        pytest.fail("\n".join([(done.stdout + done.stderr)[-4000:], *tails]))


def _launch(config: TrainerConfig, tmp_path: Path) -> None:
    file = write_config(config, tmp_path / f"{config.run_name}-{config.training.max_steps}.json")
    _run_without_ray([sys.executable, "-m", "llmtrain_trainer.launch", "--config", str(file)], tmp_path)


def _steps(config: TrainerConfig) -> list[int]:
    return sorted(int(p.name.removeprefix("checkpoint-step-")) for p in complete_checkpoints(run_dir(config)))


def test_a_launch_in_this_process_trains_prunes_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch.main in the test's own process, for `make test-fast` (the slow tests below start it as
    the CLI does): a lone rank on its own file rendezvous trains, keeps checkpoint.keep checkpoints,
    leaves no process group behind, and a second launch resumes from the newest checkpoint."""
    import torch.distributed as dist
    from llmtrain_trainer import launch

    placement = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
    for name in (*placement, "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR"):
        # launch sets them: recorded by setenv, so teardown removes them again (a LOCAL_RANK left
        # behind makes a later Hugging Face Trainer in this process start a process group)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    def run(steps: int) -> TrainerConfig:
        config = tiny_config(
            tmp_path,
            "here",
            scaling={"numWorkers": 1},
            training={"maxSteps": steps, "lrScheduler": "constant", "warmupRatio": 0.0},
            checkpoint={"everySteps": 1, "keep": 1},
        )
        file = write_config(config, tmp_path / f"here-{steps}.json")
        assert launch.main(["--config", str(file), "--no-log-lines"]) == 0
        assert not dist.is_initialized()
        return config

    first = run(2)
    assert result(first)["steps"] == 2 and result(first)["resumed_from_step"] is None
    assert _steps(first) == [2]
    second = run(3)
    assert result(second)["steps"] == 3 and result(second)["resumed_from_step"] == 2
    assert _steps(second) == [3]
    assert set(losses(second)) == {1, 2, 3}


@pytest.mark.slow  # real training processes
def test_one_process_trains_keeps_checkpoints_and_resumes_without_ray(tmp_path: Path) -> None:
    def config(steps: int) -> TrainerConfig:
        return tiny_config(
            tmp_path,
            "alone",
            scaling={"numWorkers": 1},
            training={"maxSteps": steps, "lrScheduler": "constant", "warmupRatio": 0.0},
            checkpoint={"everySteps": 2, "keep": 2},
        )

    first = config(6)
    _launch(first, tmp_path)
    assert result(first)["steps"] == 6 and result(first)["world_size"] == 1
    assert result(first)["resumed_from_step"] is None
    assert _steps(first) == [4, 6]  # step 2's pruned after step 6's was reported
    trained = losses(first)

    second = config(10)
    _launch(second, tmp_path)
    done = result(second)
    assert done["steps"] == 10 and done["resumed_from_step"] == 6
    assert done["checkpoint"] == str(run_dir(second) / checkpoint_name(10))
    assert _steps(second) == [8, 10]
    assert set(losses(second)) == set(range(1, 11))
    assert all(losses(second)[step] == trained[step] for step in range(1, 7))  # steps 1-6 not redone


@pytest.mark.slow  # real training processes
def test_evaluation_every_n_steps_from_a_validation_file_reports_the_best(tmp_path: Path) -> None:
    """dataset.validationPath with training.evalEverySteps 2 and checkpoints every 4 (exportBest):
    the loss is evaluated every 2 steps from the held-out file, status.progress gets the latest and
    best evaluation, and the best checkpoint is one evaluated at its own step."""
    from llmtrain.api.status import Progress
    from llmtrain_trainer.kube_progress import progress_fields
    from llmtrain_trainer.progress import read_records
    from llmtrain_trainer.rundir import METRICS_FILE

    stories = TINY_STORIES.read_text().split("\n\n")
    held_out = tmp_path / "held-out.txt"
    held_out.write_text("\n\n".join(stories[:30]))
    config = tiny_config(
        tmp_path,
        "cadence",
        scaling={"numWorkers": 1},
        dataset={"validationPath": str(held_out)},
        training={"maxSteps": 10, "evalEverySteps": 2},
        checkpoint={"everySteps": 4, "keep": 5, "exportBest": True, "export": True},
    )
    _launch(config, tmp_path)
    records = read_records(run_dir(config) / METRICS_FILE)
    evaluations = {r.step: r for r in records if r.event == "validation"}
    # Every 2 steps; step 10 also closes the run with a checkpoint, on the grid of 2 anyway.
    assert sorted(evaluations) == [2, 4, 6, 8, 10]
    losses_at = {step: r.val_loss for step, r in evaluations.items()}
    assert all(loss is not None and 0 < loss < 10 for loss in losses_at.values())
    best_step = min(losses_at, key=lambda s: losses_at[s])  # type: ignore[arg-type, return-value]
    status: dict[str, object] = {}
    for record in records:
        status = progress_fields(status, record)
    assert status["evalLoss"] == round(losses_at[10], 6)  # type: ignore[arg-type]
    assert (status["bestEvalLoss"], status["bestStep"]) == (round(losses_at[best_step], 6), best_step)  # type: ignore[arg-type]
    assert Progress.model_validate(status).to_patch() == status
    # The exported best is the best of the checkpointed evaluations (steps 4, 8, 10).
    done = result(config)
    best_checkpoint = min((4, 8, 10), key=lambda s: losses_at[s])  # type: ignore[arg-type, return-value]
    assert done["best_checkpoint"] == str(run_dir(config) / checkpoint_name(best_checkpoint))
    assert done["best_val_loss"] == losses_at[best_checkpoint]
    assert _steps(config) == [4, 8, 10]


@pytest.mark.slow  # real training processes
def test_early_stopping_between_checkpoints_saves_the_state_it_stops_with(tmp_path: Path) -> None:
    """An evaluation off the checkpoint grid ends the run (patience 1, an unreachable minDelta):
    the run stops there, successfully, and checkpoints that step as it would its last."""
    config = tiny_config(
        tmp_path,
        "stop",
        scaling={"numWorkers": 1},
        dataset={"validationSplit": 0.2},
        training={"maxSteps": 20, "evalEverySteps": 3, "earlyStopping": {"patience": 1, "minDelta": 100}},
        checkpoint={"everySteps": 4, "keep": 5},
    )
    _launch(config, tmp_path)
    done = result(config)
    assert done["steps"] == 6 and done["stopped_early"].startswith("early stopping at step 6")
    assert _steps(config) == [4, 6]


@pytest.mark.slow  # real training processes
def test_llmtrain_run_no_ray_trains_a_two_worker_job_with_torchrun(tmp_path: Path) -> None:
    """`llmtrain run --no-ray` on the demo job (2 workers): torchrun starts a rank per worker."""
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"]["dataset"]["path"] = str(REPO / "examples" / "data" / "tiny-stories.txt")
    job["spec"]["training"].update(maxSteps=4, logEverySteps=1)
    job["spec"]["checkpoint"].update(everySteps=2, keep=1)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    runs = tmp_path / "runs"
    cli = (
        sys.executable,
        "-c",
        "import sys; from llmtrain.cli import main; sys.exit(main())",
        "run",
        "--no-ray",
    )
    _run_without_ray([*cli, "--runs-dir", str(runs), str(tmp_path / "job.yaml")], tmp_path)
    [run] = [p.parent for p in runs.rglob(RESULT_FILE)]
    done = RunResult.read(run)
    assert done is not None and done.steps == 4 and done.world_size == 2
    assert [p.name for p in complete_checkpoints(run)] == [checkpoint_name(4)]
    assert (run / "logs" / "worker-1.log").exists() and (run / "summary.json").exists()


@pytest.mark.usefixtures("one_process_group")
def test_without_ray_checkpoints_ranked_by_validation_loss_keep_the_best_and_the_latest(
    tmp_path: Path,
) -> None:
    """checkpoint.keepBest/exportBest: as Ray's checkpoint_score_attribute does, the `keep` lowest
    validation losses stay, and the latest (a restart resumes from it); exportBest then finds the
    best checkpoint's weights. Without ranking, the newest `keep` stay."""
    import torch
    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.run_context import LocalRunContext, ranks_by_val_loss

    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))

    def run(context: LocalRunContext, losses: dict[int, float], folder: Path) -> list[int]:
        folder.mkdir()
        for step, val_loss in losses.items():
            checkpoint = folder / checkpoint_name(step)
            checkpoint.mkdir()
            (checkpoint / "trainer_state.json").write_text("{}")  # complete
            context.report_checkpoint(checkpoint, {"val_loss": val_loss}, env)
        return sorted(int(p.name.rsplit("-", 1)[1]) for p in complete_checkpoints(folder))

    losses = {2: 1.0, 4: 0.5, 6: 0.7, 8: 0.9, 10: 1.2}
    assert run(LocalRunContext(2, by_val_loss=True), losses, tmp_path / "best") == [4, 6, 10]
    assert run(LocalRunContext(2), losses, tmp_path / "newest") == [8, 10]
    config = tiny_config(
        tmp_path, "ranked", checkpoint={"exportBest": True}, dataset={"validationSplit": 0.2}
    )
    assert ranks_by_val_loss(config) and not ranks_by_val_loss(tiny_config(tmp_path, "plain"))

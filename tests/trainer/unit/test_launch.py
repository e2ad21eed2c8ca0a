"""The launch without Ray (launch.py): in processes where `import ray` fails, a run trains, keeps
checkpoint.keep checkpoints as Ray's num_to_keep would, and a second launch resumes it; torchrun
starts one process per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.rundir import checkpoint_name, complete_checkpoints

from tests.support.trainer import losses, result, run_dir, tiny_config, write_config

NO_RAY = 'import sys\nsys.modules["ray"] = None  # this machine has no Ray: any import of it fails\n'


def _launch(config: TrainerConfig, tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` (python by default) on `config` with Ray unimportable in every process."""
    site = tmp_path / "no-ray"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_RAY)  # imported at the start of every interpreter
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    file = write_config(config, tmp_path / f"{config.run_name}-{config.training.max_steps}.json")
    args = [*(command or (sys.executable, "-m", "llmtrain_trainer.launch")), "--config", str(file)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _steps(config: TrainerConfig) -> list[int]:
    return sorted(int(p.name.removeprefix("checkpoint-step-")) for p in complete_checkpoints(run_dir(config)))


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


def test_torchrun_starts_a_process_per_rank(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "ranks", training={"maxSteps": 4}, checkpoint={"everySteps": 2, "keep": 1})
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    _launch(config, tmp_path, *torchrun, "-m", "llmtrain_trainer.launch")
    assert result(config)["steps"] == 4 and result(config)["world_size"] == 2
    assert _steps(config) == [4]
    logs = run_dir(config) / "logs"
    assert (logs / "worker-0.log").exists() and (logs / "worker-1.log").exists()

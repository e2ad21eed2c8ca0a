"""spec.resumeFrom targets, found or refused with a message naming them, without Ray or torch work.

The driver checks them in preflight (test_preflight.py covers the exit code); the slow end-to-end
behaviour is in test_run_identity.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.trainer_config import ResumeSource
from llmtrain_trainer.resume_from import ResumeFromError, check_compatible, resolve, run_shape
from llmtrain_trainer.rundir import STATE_FILE, checkpoint_name

from tests.support.trainer import tiny_config


def checkpoint(run: Path, step: int, shape: dict[str, Any] | None = None, complete: bool = True) -> Path:
    directory = run / checkpoint_name(step)
    directory.mkdir(parents=True)
    if complete:
        (directory / STATE_FILE).write_text(json.dumps({"step": step, "shape": shape or {}}))
    return directory


def test_a_run_is_found_by_job_and_id_or_by_id_alone_and_its_latest_complete_checkpoint_used(
    tmp_path: Path,
) -> None:
    old = tmp_path / "story" / "uid-a"
    checkpoint(old, 3)
    latest = checkpoint(old, 6)
    checkpoint(old, 9, complete=False)  # died while writing: never the one to continue
    for ref in ("story/uid-a", "uid-a"):
        seed = resolve(ResumeSource(runs_root=str(tmp_path), run=ref), tmp_path / "story" / "uid-b")
        assert seed.directory == latest and seed.full_state


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("story/uid-x", r"resumeFrom\.run 'story/uid-x': no run directory .*/story/uid-x"),
        ("uid-x", r"resumeFrom\.run 'uid-x': no run with that id under "),
        ("empty/uid-e", r"resumeFrom\.run 'empty/uid-e': .*/empty/uid-e holds no complete checkpoint"),
        ("twice", r"resumeFrom\.run 'twice' is ambiguous \(a/twice, b/twice\): write '<job name>/twice'"),
        ("story/uid-b", r"resumeFrom\.run 'story/uid-b' names this job's own run"),
    ],
)
def test_a_missing_or_unusable_run_is_named(tmp_path: Path, ref: str, message: str) -> None:
    checkpoint(tmp_path / "story" / "uid-a", 3)
    checkpoint(tmp_path / "empty" / "uid-e", 3, complete=False)
    (tmp_path / "a" / "twice").mkdir(parents=True)
    (tmp_path / "b" / "twice").mkdir(parents=True)
    with pytest.raises(ResumeFromError, match=message):
        resolve(ResumeSource(runs_root=str(tmp_path), run=ref), tmp_path / "story" / "uid-b")


def test_a_checkpoint_seeds_weights_only_and_must_be_a_complete_checkpoint(tmp_path: Path) -> None:
    good = checkpoint(tmp_path / "seeds", 6)
    seed = resolve(ResumeSource(runs_root=str(tmp_path), checkpoint=str(good)), tmp_path / "own")
    assert seed.directory == good and not seed.full_state
    with pytest.raises(ResumeFromError, match=r"resumeFrom\.checkpoint .*/seeds/absent does not exist"):
        resolve(ResumeSource(runs_root=str(tmp_path), checkpoint=str(tmp_path / "seeds/absent")), tmp_path)
    with pytest.raises(ResumeFromError, match=r"resumeFrom\.checkpoint .*/seeds is not a complete"):
        resolve(ResumeSource(runs_root=str(tmp_path), checkpoint=str(tmp_path / "seeds")), tmp_path)


def test_a_checkpoint_of_another_shape_is_refused_naming_the_difference(tmp_path: Path) -> None:
    fsdp = tiny_config(tmp_path, "x")
    ddp = tiny_config(tmp_path, "x", strategy={"type": "ddp"})
    lora = tiny_config(tmp_path, "x", method={"type": "lora"})
    zero3 = tiny_config(tmp_path, "x", strategy={"type": "deepspeed", "deepspeed": {"zeroStage": 3}})
    written = checkpoint(tmp_path / "job" / "uid-a", 6, shape=run_shape(fsdp))
    runs = str(tmp_path)
    continued = resolve(ResumeSource(runs_root=runs, run="uid-a"), tmp_path / "own")
    seeded = resolve(ResumeSource(runs_root=runs, checkpoint=str(written)), tmp_path / "own")

    check_compatible(continued, fsdp)
    check_compatible(seeded, ddp)  # DCP either way: the weights load
    with pytest.raises(
        ResumeFromError, match=r"written with strategy fsdp \(this job: ddp\); use resumeFrom"
    ):
        check_compatible(continued, ddp)
    with pytest.raises(ResumeFromError, match=r"written with method full \(this job: lora\)"):
        check_compatible(seeded, lora)
    with pytest.raises(ResumeFromError, match=r"written with strategy fsdp \(this job: deepspeed\)"):
        check_compatible(seeded, zero3)

    zero3_checkpoint = checkpoint(tmp_path / "z", 3, shape=run_shape(zero3))
    with pytest.raises(ResumeFromError, match=r"a ZeRO-3 checkpoint can only be continued"):
        check_compatible(
            resolve(ResumeSource(runs_root=runs, checkpoint=str(zero3_checkpoint)), tmp_path), zero3
        )


def test_a_checkpoint_of_another_trainer_is_refused_naming_both(tmp_path: Path) -> None:
    """The Hugging Face Trainer's files, a custom function's state.pt and the built-in loop's DCP
    shards are not interchangeable; the built-in loop's checkpoints name no trainer."""
    runs = str(tmp_path)
    builtin = checkpoint(tmp_path / "job" / "uid-b", 6)
    custom = checkpoint(tmp_path / "job" / "uid-c", 6)
    state = json.loads((custom / STATE_FILE).read_text())
    (custom / STATE_FILE).write_text(json.dumps({**state, "trainer": "custom"}))
    custom_job = tiny_config(tmp_path, "x", trainer={"type": "custom", "custom": {"function": "m:f"}})
    hf_job = tiny_config(tmp_path, "x", strategy={"type": "ddp"}, trainer={"type": "huggingface"})

    check_compatible(resolve(ResumeSource(runs_root=runs, run="uid-c"), tmp_path / "own"), custom_job)
    with pytest.raises(
        ResumeFromError,
        match=r"resumeFrom run uid-b .* was written by trainer.type builtin \(this job: custom\)",
    ):
        check_compatible(resolve(ResumeSource(runs_root=runs, run="uid-b"), tmp_path / "own"), custom_job)
    with pytest.raises(ResumeFromError, match=r"trainer.type custom \(this job: huggingface\)"):
        check_compatible(resolve(ResumeSource(runs_root=runs, run="uid-c"), tmp_path / "own"), hf_job)
    check_compatible(
        resolve(ResumeSource(runs_root=runs, checkpoint=str(builtin)), tmp_path / "own"),
        tiny_config(tmp_path, "x"),
    )


@pytest.mark.parametrize("source", ["run", "checkpoint"])
def test_a_mode_run_starts_where_resume_from_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Every mode's lifecycle: on a first attempt (no checkpoint of its own) resumeFrom.run becomes
    the checkpoint to resume from, at its step; resumeFrom.checkpoint only a seed."""
    import ray.train
    from llmtrain_trainer.lifecycle import resume_point

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)  # the run's first attempt
    earlier = tmp_path / "job" / "uid-a"
    checkpoint(earlier, 10)
    latest = checkpoint(earlier, 20)
    resume_from = {"runsRoot": str(tmp_path), source: "job/uid-a" if source == "run" else str(latest)}
    config = tiny_config(
        tmp_path / "job",
        "uid-b",
        trainer={"type": "custom", "custom": {"function": "m:f"}},
        resumeFrom=resume_from,
    )
    point = resume_point(config, Path(config.run_dir))
    if source == "run":
        assert (point.checkpoint, point.step, point.seed, point.own) == (latest, 20, None, False)
    else:
        assert (point.checkpoint, point.step, point.seed) == (None, None, latest)
    assert point.described is not None and str(latest) in point.described

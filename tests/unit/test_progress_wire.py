"""status.progress has one wire form: the trainer's reporter builds it with the API's `Progress`
model, so what it patches is what the CRD declares."""

from __future__ import annotations

import json

import pytest
from llmtrain.api.status import Progress
from llmtrain_trainer.kube_progress import progress_fields
from llmtrain_trainer.metrics import MetricsRecord
from pydantic import ValidationError


def test_the_reporters_block_is_the_models_wire_form() -> None:
    state = progress_fields(
        {}, MetricsRecord("step", 3, 10, time=0.0, loss=1.25, learning_rate=1e-4, eta_seconds=9.7)
    )
    assert state == {
        "step": 3,
        "totalSteps": 10,
        "summary": "3/10",
        "loss": 1.25,
        "learningRate": 0.0001,
        "etaSeconds": 9,
        "updatedAt": "1970-01-01T00:00:00Z",
    }
    state = progress_fields(
        state, MetricsRecord("checkpoint", 4, 10, time=1.0, path="/c", checkpoint_seconds=2.5)
    )
    assert state["lastCheckpoint"] == {"path": "/c", "step": 4, "seconds": 2.5}
    assert state["loss"] == 1.25  # kept from the earlier report
    assert Progress.model_validate(state).to_patch() == state


def test_a_cleared_root_cause_stays_null_so_the_merge_patch_deletes_it() -> None:
    cleared = Progress.model_validate({"step": 1, "error": None}).to_patch()
    assert cleared == {"step": 1, "error": None}
    assert progress_fields(cleared, MetricsRecord("step", 2, 10, time=0.0))["error"] is None


def test_a_field_the_crd_does_not_declare_is_refused() -> None:
    with pytest.raises(ValidationError):
        progress_fields({"stepz": 1}, MetricsRecord("step", 2, 10, time=0.0))


def test_notices_accumulate_once_each_and_stay_within_the_crds_bounds() -> None:
    from llmtrain.api.status import NOTICE_MAX_LENGTH, NOTICES_MAX

    state = progress_fields({}, MetricsRecord("notice", 1, 10, time=0.0, message="compile fell back"))
    assert state["notices"] == ["compile fell back"]
    state = progress_fields(state, MetricsRecord("step", 2, 10, time=1.0, loss=1.0))
    assert state["notices"] == ["compile fell back"]  # kept across reports
    state = progress_fields(state, MetricsRecord("notice", 3, 10, time=2.0, message="compile fell back"))
    assert state["notices"] == ["compile fell back"]  # said once
    for i in range(NOTICES_MAX + 2):
        state = progress_fields(state, MetricsRecord("notice", 4, 10, time=3.0, message=f"n{i} " + "x" * 600))
    assert len(state["notices"]) == NOTICES_MAX and state["notices"][-1].startswith(f"n{NOTICES_MAX + 1} ")
    assert all(len(n) <= NOTICE_MAX_LENGTH for n in state["notices"])
    assert Progress.model_validate(state).to_patch() == state


def test_evaluations_report_the_latest_and_the_best_loss() -> None:
    """status.progress.evalLoss/evalStep follow every evaluation; bestEvalLoss/bestStep are the
    trainer's own best when the record carries it (the builtin loop: minDelta-aware, kept across a
    resume), else the lowest loss this reporter has seen (the huggingface trainer)."""
    state = progress_fields({}, MetricsRecord("validation", 5, 20, time=0.0, val_loss=2.5))
    assert (state["evalLoss"], state["evalStep"], state["bestEvalLoss"], state["bestStep"]) == (
        2.5,
        5,
        2.5,
        5,
    )
    state = progress_fields(state, MetricsRecord("validation", 10, 20, time=1.0, val_loss=2.75))
    assert (state["evalLoss"], state["evalStep"], state["bestEvalLoss"], state["bestStep"]) == (
        2.75,
        10,
        2.5,
        5,
    )
    state = progress_fields(state, MetricsRecord("validation", 15, 20, time=2.0, val_loss=2.0))
    assert (state["bestEvalLoss"], state["bestStep"]) == (2.0, 15)
    # The trainer's best wins: 1.99 is not an improvement by more than its minDelta.
    state = progress_fields(
        state, MetricsRecord("validation", 20, 20, time=3.0, val_loss=1.99, best_val_loss=2.0, best_step=15)
    )
    assert (state["evalLoss"], state["bestEvalLoss"], state["bestStep"]) == (1.99, 2.0, 15)
    # A later step report keeps them; a diverged loss reports nothing.
    state = progress_fields(state, MetricsRecord("step", 20, 20, time=4.0, loss=1.0))
    state = progress_fields(state, MetricsRecord("validation", 21, 30, time=5.0, val_loss=float("nan")))
    assert (state["evalLoss"], state["evalStep"], state["bestEvalLoss"]) == (1.99, 20, 2.0)
    assert Progress.model_validate(state).to_patch() == state


def test_the_best_evaluation_fields_are_in_the_crds_status_schema() -> None:
    """The operator's CRD declares what the reporter writes (both derive from `Progress`)."""
    from llmtrain.api.crd import openapi_schema

    progress = openapi_schema()["properties"]["status"]["properties"]["progress"]["properties"]
    for name in ("evalLoss", "evalStep", "bestEvalLoss", "bestStep"):
        assert progress[name]["type"] in {"number", "integer"}, name


def test_a_loss_that_is_not_finite_is_said_in_a_notice_and_never_patched() -> None:
    """JSON has no NaN: a patch holding one is refused by the API server, and the state would carry
    it into every later patch, freezing the job's progress for the rest of the run."""
    state = progress_fields({}, MetricsRecord("step", 10, 100, time=0.0, loss=2.0, learning_rate=1e-3))
    state = progress_fields(
        state, MetricsRecord("step", 20, 100, time=1.0, loss=float("nan"), learning_rate=float("inf"))
    )
    assert state["loss"] == 2.0 and state["learningRate"] == 0.001 and state["step"] == 20
    assert state["notices"] == [
        "the training loss is not finite (nan) at step 20: training has diverged; lower "
        "training.learningRate or set training.maxGradNorm, and resume from a checkpoint before it "
        "(spec.resumeFrom)"
    ]
    json.dumps(state, allow_nan=False)  # what the API server can read
    state = progress_fields(state, MetricsRecord("step", 30, 100, time=2.0, loss=float("inf")))
    assert len(state["notices"]) == 1  # said once, with the first step it was seen at
    assert Progress.model_validate(state).to_patch() == state

"""status.progress has one wire form: the trainer's reporter builds it with the API's `Progress`
model, so what it patches is what the CRD declares."""

from __future__ import annotations

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

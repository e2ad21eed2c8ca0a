"""The trainer waits for its own job's config: a job re-created under the same name must never
train on the earlier job's mounted config (the real-pod lifecycle scenario saw the new job report the
old run's step 400 and checkpoint)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from llmtrain.api.job import LLMTrainingJob
from llmtrain.render.trainer_config import cluster_trainer_config
from llmtrain_trainer.config import JOB_UID_ENV, ConfigError, load_current_config

from tests.support.jobs import load_example


def _config_file(tmp_path: Path, uid: str) -> Path:
    doc = load_example("tiny-cpu.yaml")
    doc["metadata"] = {**doc["metadata"], "namespace": "ns", "uid": uid}
    config = cluster_trainer_config(LLMTrainingJob.model_validate(doc))
    path = tmp_path / "config.json"
    path.write_text(config.model_dump_json(by_alias=True, exclude_none=True))
    return path


def test_an_earlier_jobs_config_is_waited_out_until_the_kubelet_refreshes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config_file(tmp_path, "old-uid")
    (tmp_path / "new").mkdir()
    fresh = _config_file(tmp_path / "new", "new-uid")
    monkeypatch.setenv(JOB_UID_ENV, "new-uid")
    threading.Timer(0.3, lambda: path.write_text(fresh.read_text())).start()
    assert load_current_config(path, timeout=10, poll=0.05).run_name == "new-uid"


def test_a_config_that_never_becomes_this_jobs_fails_naming_both_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config_file(tmp_path, "old-uid")
    monkeypatch.setenv(JOB_UID_ENV, "new-uid")
    with pytest.raises(ConfigError, match=r"old-uid.*new-uid"):
        load_current_config(path, timeout=0.2, poll=0.05)
    monkeypatch.delenv(JOB_UID_ENV)
    assert load_current_config(path, timeout=0.2).run_name == "old-uid", "outside a pod: as mounted"

"""result.json (`RunResult`): what `llmtrain run`, the tests and people read after a run."""

from __future__ import annotations

import json
from pathlib import Path

from llmtrain_trainer.rundir import RESULT_FILE, RunResult


def test_a_result_reads_back_as_written_with_its_skipped_checkpoints(tmp_path: Path) -> None:
    result = RunResult(steps=40, skipped_checkpoints=("checkpoint-step-00000040 (rank 0: torn)",))
    result.write(tmp_path)
    text = (tmp_path / RESULT_FILE).read_text()
    # Indented for people who `cat` it; JSON has no tuples, so the list is written.
    assert text == json.dumps(result.to_dict(), indent=2) + "\n"
    assert json.loads(text)["skipped_checkpoints"] == ["checkpoint-step-00000040 (rank 0: torn)"]
    assert RunResult.read(tmp_path) == result


def test_an_older_result_without_skipped_checkpoints_reads_as_none_skipped(tmp_path: Path) -> None:
    written = RunResult(steps=3).to_dict()
    del written["skipped_checkpoints"]
    written["from_a_newer_version"] = True
    (tmp_path / RESULT_FILE).write_text(json.dumps(written))
    result = RunResult.read(tmp_path)
    assert result is not None and result.skipped_checkpoints == () and result.steps == 3

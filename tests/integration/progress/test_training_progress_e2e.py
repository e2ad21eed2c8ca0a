"""End to end in the emulator: a trainer process trains the tiny model on CPU with progress
reporting on, and the LLMTrainingJob's printer-column fields (what `kubectl get llmtj` shows)
advance while it runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.crd import PRINTER_COLUMNS
from llmtrain.api.trainer_config import ProgressSpec
from llmtrain.api.validation import parse_job
from llmtrain.render.trainer_config import local_trainer_config
from llmtrain_trainer.kube_progress import API_SERVER_ENV

from tests.support.apiserver.server import ApiServer
from tests.support.jobs import REPO_ROOT, load_example

JOB = ("llmtrain.dev/v1alpha1", "LLMTrainingJob")
STEPS = 24


def column_values(obj: dict[str, Any]) -> dict[str, Any]:
    """Evaluate each printer column's simple JSONPath (.a.b.c) the way kubectl does."""
    out: dict[str, Any] = {}
    for column in PRINTER_COLUMNS:
        node: Any = obj
        for part in column["jsonPath"].strip(".").split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[column["name"]] = node
    return out


@pytest.mark.slow
async def test_printer_columns_advance_during_cpu_training(apiserver: ApiServer, tmp_path: Path) -> None:
    doc = load_example("tiny-cpu.yaml")
    doc["metadata"]["name"] = "live"
    doc["spec"]["training"].update(maxSteps=STEPS, logEverySteps=4)
    doc["spec"]["checkpoint"].update(everySteps=12)
    await apiserver.create(doc)
    config = local_trainer_config(parse_job(doc), REPO_ROOT / "examples", tmp_path / "runs")
    config = config.model_copy(
        update={"progress": ProgressSpec(report_to_kubernetes=True, interval_seconds=0.5)}
    )
    config_file = tmp_path / "trainer-config.json"
    config_file.write_text(config.model_dump_json(by_alias=True))
    env = {**os.environ, API_SERVER_ENV: apiserver.url}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtrain_trainer.main", "--config", str(config_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 600
    while proc.poll() is None:
        assert time.monotonic() < deadline, "training did not finish in 10 minutes"
        columns = column_values(apiserver.stored(*JOB, "default", "live") or {})
        if columns["Progress"] and (not seen or seen[-1]["Progress"] != columns["Progress"]):
            seen.append(columns)
        await asyncio.sleep(0.2)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output[-4000:]
    final = column_values(apiserver.stored(*JOB, "default", "live") or {})
    if not seen or seen[-1]["Progress"] != final["Progress"]:
        seen.append(final)
    steps = [int(c["Progress"].split("/")[0]) for c in seen]
    assert len(steps) >= 3, seen  # observed advancing while training ran, not only at the end
    assert steps == sorted(steps) and steps[-1] == STEPS
    assert final["Progress"] == f"{STEPS}/{STEPS}"
    first_loss = next(c["Loss"] for c in seen if c["Loss"] is not None)
    assert isinstance(final["Loss"], float) and final["Loss"] < first_loss
    assert final["Tokens/s"] and final["Tokens/s"] > 0
    progress = apiserver.stored(*JOB, "default", "live")["status"]["progress"]  # type: ignore[index]
    assert progress["lastCheckpoint"]["step"] in (12, 24)
    assert progress["lastCheckpoint"]["path"].startswith(str(tmp_path / "runs" / "live"))

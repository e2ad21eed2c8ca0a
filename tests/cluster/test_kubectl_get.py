"""`kubectl get` of LLMTrainingJobs with the real kubectl and API server: the CRD's printer columns
show what a user watches a run by (phase, progress, loss), under every name the CRD declares."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    cpu_job,
    job_status,
    set_progress,
    table,
    wait_phase,
)

COLUMNS = ["NAME", "PHASE", "STRATEGY", "WORKERS", "GPUS", "PROGRESS", "LOSS", "AGE"]
WIDE_COLUMNS = [*COLUMNS, "EVALLOSS", "METHOD", "MODEL", "TOKENS/S", "ETA(S)", "RAYJOB", "MESSAGE"]
# Every name manifests/crds declares: plural, singular, fully qualified, versioned, short name.
NAMES = [
    "llmtrainingjobs",
    "llmtrainingjob",
    "llmtrainingjobs.llmtrain.dev",
    "llmtrainingjobs.v1alpha1.llmtrain.dev",
    "llmtj",
]
CATEGORIES = ["llmtrain", "ml"]


def listed_job(name: str, namespace: str, *, suspend: bool = False) -> dict[str, Any]:
    """Method and Model differ from the defaults, so the wide columns show real values."""
    return cpu_job(
        name,
        namespace,
        suspend=suspend,
        workers=2,
        model={"name": "Qwen/Qwen2.5-0.5B"},
        method={"type": "lora"},
        strategy={"type": "ddp"},
    )


pytestmark = pytest.mark.usefixtures("jobs_deleted_first")


def test_columns_show_phase_progress_and_loss_from_the_status(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, listed_job("tiny", namespace))
    wait_phase(cluster, namespace, "tiny", "Running")
    progress = {
        "step": 120,
        "totalSteps": 1000,
        "summary": "120/1000",
        "loss": 1.2345,
        "tokensPerSecond": 5321.5,
        "etaSeconds": 3600,
        "evalLoss": 1.5,
    }
    set_progress(cluster, namespace, "tiny", progress)

    rows = table(cluster.kubectl("get", "llmtj", "-n", namespace).stdout)
    assert [list(r) for r in rows] == [COLUMNS], rows
    [row] = rows
    assert {k: v for k, v in row.items() if k != "AGE"} == {
        "NAME": "tiny",
        "PHASE": "Running",
        "STRATEGY": "ddp",
        "WORKERS": "2",
        "GPUS": "0",
        "PROGRESS": "120/1000",
        "LOSS": "1.2345",
    }, row
    assert re.fullmatch(r"\d+s", row["AGE"]), row

    [wide] = table(cluster.kubectl("get", "llmtj", "-n", namespace, "-o", "wide").stdout)
    status = job_status(cluster, namespace, "tiny")
    assert list(wide) == WIDE_COLUMNS, wide
    assert {k: wide[k] for k in WIDE_COLUMNS[len(COLUMNS) :]} == {
        "EVALLOSS": "1.5",
        "METHOD": "lora",
        "MODEL": "Qwen/Qwen2.5-0.5B",
        "TOKENS/S": "5321.5",
        "ETA(S)": "3600",
        "RAYJOB": status["rayJobName"],
        "MESSAGE": status["message"],
    }, (wide, status)
    assert wide["RAYJOB"] == "tiny" and wide["MESSAGE"], wide


def test_all_namespaces_every_name_and_the_categories_list_jobs(
    cluster: Cluster, operator: OperatorProcess, namespace: str, other_namespace: str
) -> None:
    apply_doc(cluster, listed_job("alpha", namespace, suspend=True))
    apply_doc(cluster, listed_job("beta", other_namespace, suspend=True))
    for ns, name in ((namespace, "alpha"), (other_namespace, "beta")):
        wait_phase(cluster, ns, name, "Suspended")

    rows = table(cluster.kubectl("get", "llmtj", "-A").stdout)
    assert list(rows[0]) == ["NAMESPACE", *COLUMNS], rows[0]
    listed = {(r["NAMESPACE"], r["NAME"]): r["PHASE"] for r in rows}
    assert listed[(namespace, "alpha")] == listed[(other_namespace, "beta")] == "Suspended", listed

    def without_age(text: str) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "AGE"} for r in table(text)]

    expected = without_age(cluster.kubectl("get", "llmtj", "-n", namespace).stdout)
    assert [r["NAME"] for r in expected] == ["alpha"]
    for name in NAMES:
        assert without_age(cluster.kubectl("get", name, "-n", namespace).stdout) == expected, name
        found = cluster.kubectl("get", name, "alpha", "-n", namespace, "-o", "name").stdout.split()
        assert found == ["llmtrainingjob.llmtrain.dev/alpha"], (name, found)
    for category in CATEGORIES:
        for ns, name in ((namespace, "alpha"), (other_namespace, "beta")):
            found = cluster.kubectl("get", category, "-n", ns, "-o", "name").stdout.split()
            assert found == [f"llmtrainingjob.llmtrain.dev/{name}"], (category, found)

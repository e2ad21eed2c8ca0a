"""What the cluster verbs print (jobs_view.py), from plain status dicts, and the parts of the CLI
that act before any cluster is reached: `--version`, the plugin's name, and `submit` refusing a bad
spec with the field and the fix. Every verb against a real API server: tests/cluster/test_jobs_cli.py."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import jobs_view
from llmtrain.cli import main
from llmtrain.constants import ROLE_LABEL, VERSION

from tests.support.jobs import REPO_ROOT, minimal_job

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)


def job(status: dict[str, Any] | None = None, name: str = "tiny", namespace: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-11-26T11:00:00Z"},
        "status": status or {},
    }


RUNNING = {
    "phase": "Running",
    "message": "RayJob tiny is Running",
    "progress": {
        "step": 120,
        "totalSteps": 1000,
        "loss": 1.23456,
        "tokensPerSecond": 5321.5,
        "etaSeconds": 3725,
        "lastCheckpoint": {"path": "/mnt/llmtrain/tiny/checkpoint-step-00000100", "step": 100},
        "updatedAt": "2026-11-26T11:59:30Z",
    },
    "rayJobName": "tiny",
    "retries": 0,
    "conditions": [
        {
            "type": "Running",
            "status": "True",
            "reason": "RayJobRunning",
            "lastTransitionTime": "2026-11-26T11:55:00Z",
            "message": "the Ray job runs",
        }
    ],
}


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (59.6, "1:00"), (61, "1:01"), (3725, "1:02:05"), (90000, "25:00:00")]
)
def test_format_duration_is_a_clock(seconds: float, text: str) -> None:
    assert jobs_view.format_duration(seconds) == text


@pytest.mark.parametrize(
    ("stamp", "text"),
    [
        ("2026-11-26T11:59:15Z", "45s"),
        ("2026-11-26T11:56:48Z", "3m12s"),
        ("2026-11-26T11:30:00Z", "30m"),
        ("2026-11-26T06:56:00Z", "5h4m"),
        ("2026-11-24T09:00:00Z", "2d3h"),
        (None, "<unknown>"),
    ],
)
def test_age_reads_like_kubectl(stamp: str | None, text: str) -> None:
    assert jobs_view.age(stamp, NOW) == text


def test_progress_line_has_bar_step_percent_and_figures() -> None:
    line = jobs_view.progress_line(job(RUNNING), width=10)
    assert line == "Running      [#.........] 120/1000  12% · loss 1.2346 · 5,322 tok/s · ETA 1:02:05"


def test_progress_line_before_the_first_report_says_why_it_waits() -> None:
    waiting = {"phase": "Pending", "message": "0/2 nodes have 8 free nvidia.com/gpu; waiting for capacity"}
    assert jobs_view.progress_line(job(waiting)) == f"Pending      {waiting['message']}"
    assert jobs_view.progress_line(job()) == "Pending"


def test_a_full_bar_at_the_end() -> None:
    done = {"phase": "Succeeded", "progress": {"step": 50, "totalSteps": 50}}
    assert jobs_view.progress_line(job(done), width=4) == "Succeeded    [####] 50/50 100%"


def test_terminal_phases_and_exit_codes() -> None:
    phases = ("Running", "Suspended", "Succeeded", "Failed")
    assert [jobs_view.is_terminal(job({"phase": p})) for p in phases] == [False, False, True, True]
    assert jobs_view.exit_code(job({"phase": "Succeeded"})) == 0
    assert jobs_view.exit_code(job({"phase": "Failed"})) == 1


def test_status_text_shows_phase_reason_progress_checkpoint_and_conditions() -> None:
    text = jobs_view.status_text(job(RUNNING), NOW)
    lines = text.splitlines()
    assert lines[:4] == [
        "Name:         tiny",
        "Namespace:    ns",
        "Phase:        Running",
        "Message:      RayJob tiny is Running",
    ]
    assert "Progress:     120/1000 (12%) · loss 1.2346 · 5,322 tok/s · ETA 1:02:05" in lines
    assert "Checkpoint:   step 100: /mnt/llmtrain/tiny/checkpoint-step-00000100" in lines
    assert "Reported:     30s ago" in lines
    assert "RayJob:       tiny" in lines and "Retries:      0" in lines
    assert lines[-3:] == [
        "Conditions:",
        "  TYPE      STATUS   REASON          AGE   MESSAGE",
        "  Running   True     RayJobRunning   5m    the Ray job runs",
    ]


def test_status_text_of_a_failed_job_shows_the_root_cause() -> None:
    failed = {"phase": "Failed", "message": "the trainer failed", "progress": {"error": "OOM on rank 1"}}
    text = jobs_view.status_text(job(failed), NOW)
    assert "Error:        OOM on rank 1" in text.splitlines()
    assert "Conditions" not in text and "Progress" not in text


def test_status_text_of_a_finished_job_shows_where_its_export_went() -> None:
    done = {"phase": "Succeeded", "progress": {"step": 30, "totalSteps": 30, "exportedTo": "s3://models/v1"}}
    lines = jobs_view.status_text(job(done), NOW).splitlines()
    assert "Exported to:  s3://models/v1" in lines
    assert "Exported to" not in jobs_view.status_text(job(RUNNING), NOW)


def test_list_table_is_sorted_and_aligned() -> None:
    jobs = [job(RUNNING, name="zeta"), job({"phase": "Suspended"}, name="alpha", namespace="other")]
    assert jobs_view.list_table(jobs, NOW).splitlines() == [
        "NAME    PHASE       PROGRESS   LOSS     TOKENS/S   ETA       AGE",
        "zeta    Running     120/1000   1.2346   5,322      1:02:05   1h",
        "alpha   Suspended                                            1h",
    ]
    wide = jobs_view.list_table(jobs, NOW, all_namespaces=True).splitlines()
    assert wide[0].split() == ["NAMESPACE", "NAME", "PHASE", "PROGRESS", "LOSS", "TOKENS/S", "ETA", "AGE"]
    assert [row.split()[:2] for row in wide[1:]] == [["ns", "zeta"], ["other", "alpha"]]


def pod(name: str, role: str, created: str = "2026-11-26T11:00:00Z", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {ROLE_LABEL: role}, "creationTimestamp": created, **meta}}


def test_select_pod_takes_the_newest_submitter_and_worker_n_by_name() -> None:
    pods = [
        pod("tiny-abc12", "submitter", "2026-11-26T11:00:00Z"),
        pod("tiny-def34", "submitter", "2026-11-26T11:05:00Z"),
        pod("tiny-xyz99", "submitter", "2026-11-26T11:09:00Z", deletionTimestamp="2026-11-26T11:10:00Z"),
        pod("tiny-head-1", "head"),
        pod("tiny-workers-b", "worker"),
        pod("tiny-workers-a", "worker"),
    ]
    assert jobs_view.select_pod(pods, "submitter")["metadata"]["name"] == "tiny-def34"
    assert jobs_view.select_pod(pods, "head")["metadata"]["name"] == "tiny-head-1"
    assert jobs_view.select_pod(pods, "worker", 0)["metadata"]["name"] == "tiny-workers-a"
    assert jobs_view.select_pod(pods, "worker", 1)["metadata"]["name"] == "tiny-workers-b"
    with pytest.raises(jobs_view.PodNotFound, match="no worker 2: it has 2 worker pod"):
        jobs_view.select_pod(pods, "worker", 2)


def test_select_pod_says_which_pods_exist_when_the_role_has_none() -> None:
    with pytest.raises(jobs_view.PodNotFound, match=r"no head pod \(it has submitter pods\)"):
        jobs_view.select_pod([pod("tiny-abc12", "submitter")], "head")
    with pytest.raises(jobs_view.PodNotFound, match="it has no pods now"):
        jobs_view.select_pod([], "submitter")


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"llmtrain {VERSION}\n"
    with pytest.raises(SystemExit):
        main(["--version"], prog="kubectl llmtrain")
    assert capsys.readouterr().out == f"kubectl llmtrain {VERSION}\n"


def test_the_kubectl_plugin_is_a_console_script() -> None:
    """kubectl finds plugins as `kubectl-<name>` executables on PATH."""
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-llmtrain"] == "llmtrain.cli:kubectl_plugin"


def test_submit_refuses_a_bad_spec_before_reaching_any_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kubeconfig named does not exist: reaching for it would be a different error."""
    bad = minimal_job("bad")
    bad["spec"]["training"] = {"maxStep": 10}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code = main(["submit", str(path), "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 1
    assert ".spec.training.maxStep: unknown field" in err, err
    assert "not submitted" in err and "kubeconfig" not in err, err


def test_submit_refuses_a_job_that_cannot_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO_ROOT / "examples" / "llama3-8b-fsdp.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["strategy"] = {"type": "ddp"}
    doc["spec"]["method"] = {"type": "full"}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(doc))
    code = main(["submit", str(tmp_path / "big.yaml"), "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 1 and "memory error: cannot fit" in err, err


def test_delete_says_whether_the_storage_and_the_model_on_it_are_kept() -> None:
    def job(storage: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"storage": storage}}

    created = {"create": {"size": "1Gi"}}
    kept = jobs_view.storage_after_delete(job(created), "j-storage")
    assert kept.startswith('persistentvolumeclaim "j-storage" kept with its runs and models'), kept
    assert kept.endswith("Free the space with: kubectl delete pvc j-storage -n ns"), kept
    retained = {"create": {"size": "1Gi", "reclaim": "Retain"}}
    assert jobs_view.storage_after_delete(job(retained), "j-storage") == kept
    deleted = jobs_view.storage_after_delete(
        job({"create": {"size": "1Gi", "reclaim": "Delete"}}), "j-storage"
    )
    assert deleted.startswith('persistentvolumeclaim "j-storage" deleted with it'), deleted
    theirs = jobs_view.storage_after_delete(job({"claimName": "data"}), "j-storage")
    assert theirs == 'persistentvolumeclaim "data" kept (storage.claimName: it is yours)'

"""`llmtrain logs --saved`: what it refuses before reaching a cluster, the messages around the saved
files, and the reader pod's shape (the upload pod's, with the claim mounted read-only)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from llmtrain import jobs_view
from llmtrain.cli import main
from llmtrain.constants import DEFAULT_MOUNT_PATH
from llmtrain.upload import Target, upload_pod


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--head"], "the head saves none"),
        (["--follow"], "--follow needs a live pod (drop --saved)"),
    ],
)
def test_saved_refuses_what_it_cannot_do_before_loading_a_kubeconfig(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["logs", "tiny", "--saved", *extra, "--kubeconfig", str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("llmtrain logs: error: --saved ") and message in err, err
    assert "kubeconfig" not in err


def test_without_saved_a_live_pod_flag_still_needs_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--head or --follow alone are not refused: only their mix with --saved is."""
    assert main(["logs", "tiny", "--head", "--kubeconfig", str(tmp_path / "absent")]) == 1
    assert "cannot load the kubeconfig" in capsys.readouterr().err


def test_saved_log_names_and_messages() -> None:
    assert jobs_view.saved_log_name(None) == "driver.log"
    assert jobs_view.saved_log_name(2) == "worker-2.log"
    assert jobs_view.saved_logs_hint("tiny", None).endswith("llmtrain logs tiny --saved")
    assert jobs_view.saved_logs_hint("tiny", 1).endswith("llmtrain logs tiny --saved --worker 1")
    where = "/mnt/llmtrain/runs/ns/tiny/u1/logs"
    assert "the trainer has not started yet" in jobs_view.no_saved_log("ns/tiny", where, "driver.log", [])
    assert jobs_view.no_saved_log("ns/tiny", where, "worker-5.log", ["driver.log", "worker-0.log"]) == (
        f"LLMTrainingJob ns/tiny: no worker-5.log in {where}; saved: driver.log, worker-0.log"
    )


def test_the_reader_pod_mounts_the_claim_read_only_under_restricted_pod_security() -> None:
    target = Target("ns", "data", PurePosixPath("."))
    reader = upload_pod(target, "img", "llmtrain-logs-abc", "/mnt/custom", read_only=True)
    spec = reader["spec"]
    (container,) = spec["containers"]
    assert container["volumeMounts"] == [{"name": "storage", "mountPath": "/mnt/custom", "readOnly": True}]
    assert spec["volumes"] == [{"name": "storage", "persistentVolumeClaim": {"claimName": "data"}}]
    assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["fsGroup"] == 1000
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    uploader = upload_pod(target, "img", "llmtrain-upload-abc")
    assert uploader["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "storage", "mountPath": DEFAULT_MOUNT_PATH}
    ]


def test_the_kubectl_plugin_has_saved(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["logs", "--help"], prog="kubectl llmtrain")
    out = capsys.readouterr().out
    assert "--saved" in out and "kubectl llmtrain logs" in out

"""Unit tests of the pieces that need no Ray: schedule, DeepSpeed config, FLOPs, the progress
reporter's API server target, local-mode files."""

from __future__ import annotations

import http.server
import itertools
import json
import math
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml
from llmtrain.api.spec import DeepSpeedSpec, TrainingSpec
from llmtrain_trainer import kube_progress, local
from llmtrain_trainer.metrics import MetricsRecord, Throughput
from llmtrain_trainer.optim import lr_factor
from llmtrain_trainer.rundir import METRICS_FILE, RESULT_FILE
from llmtrain_trainer.strategies.deepspeed import deepspeed_config

from tests.support.cluster import pki
from tests.trainer.helpers import REPO


def test_warmup_then_cosine_linear_constant() -> None:
    cosine = [lr_factor(s, warmup=10, total=110, kind="cosine") for s in range(110)]
    assert cosine[0] == pytest.approx(0.1) and cosine[9] == pytest.approx(1.0)
    assert cosine[60] == pytest.approx(0.5, abs=1e-9) and cosine[109] == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.99))
    )
    assert all(a >= b for a, b in itertools.pairwise(cosine[10:]))
    assert lr_factor(60, warmup=10, total=110, kind="linear") == pytest.approx(0.5)
    assert lr_factor(100, warmup=10, total=110, kind="constant") == 1.0


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config_is_fully_resolved(stage: int) -> None:
    spec = DeepSpeedSpec(zero_stage=stage, offload_optimizer=True, offload_params=stage == 3)
    training = TrainingSpec(micro_batch_size=4, gradient_accumulation_steps=8, max_grad_norm=0.5)
    config = deepspeed_config(spec, training, world_size=16, dtype=torch.bfloat16, hidden_size=4096)
    assert "auto" not in json.dumps(config)
    assert config["train_batch_size"] == 4 * 8 * 16
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"]["enabled"] and not config["fp16"]["enabled"]
    zero = config["zero_optimization"]
    assert zero["stage"] == stage and zero["offload_optimizer"]["device"] == "cpu"
    assert config["zero_force_ds_cpu_optimizer"] is False  # we bring a torch AdamW
    assert ("offload_param" in zero) == (stage == 3)
    assert zero.get("stage3_gather_16bit_weights_on_model_save", stage != 3) is True
    # bf16 reduces and accumulates gradients in fp32, as FSDP2's reduce_dtype does.
    assert config["communication_data_type"] == "fp32"
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_deepspeed_keeps_its_gradient_dtypes_outside_bf16(dtype: torch.dtype) -> None:
    """fp16 keeps DeepSpeed's own loss-scaled path; fp32 is fp32 throughout anyway."""
    config = deepspeed_config(DeepSpeedSpec(zero_stage=2), TrainingSpec(), 1, dtype, 64)
    assert "communication_data_type" not in config and "data_types" not in config
    assert config["fp16"]["enabled"] == (dtype == torch.float16) and config["fp16"]["loss_scale"] == 0


def test_mfu_is_throughput_over_peak() -> None:
    meter = Throughput(peak=1e12, world_size=2)
    meter._seconds, meter._started = 1.0, None  # one second of stepping, measured
    meter.add(400, 400 * 1e9)
    rate, mfu = meter.measure()
    assert rate == pytest.approx(400) and mfu == pytest.approx(400 * 1e9 / 2e12)


# ----------------------------------------------------------------------------- progress reporter


class _StatusServer(http.server.BaseHTTPRequestHandler):
    """Answers every PATCH 200 and records its path and bearer token."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 whose certificate a private CA signed; its URL and the CA file."""
    ca = pki.CertificateAuthority(tmp_path / "pki")
    pair = ca.issue("server", common_name="127.0.0.1", hosts=("127.0.0.1",))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusServer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _StatusServer.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", ca.cert
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("with_ca", [True, False])
def test_reporter_outside_a_pod_verifies_the_api_server_with_the_ca_file_from_the_env(
    tls_server: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    with_ca: bool,
) -> None:
    url, ca_file = tls_server
    monkeypatch.setenv(kube_progress.API_SERVER_ENV, url)
    monkeypatch.setenv(kube_progress.API_TOKEN_ENV, "secret")
    if with_ca:
        monkeypatch.setenv(kube_progress.API_CA_FILE_ENV, str(ca_file))
    else:
        monkeypatch.delenv(kube_progress.API_CA_FILE_ENV, raising=False)
    target = kube_progress.ApiTarget.discover()
    assert target is not None
    assert target == kube_progress.ApiTarget(url.rstrip("/"), "secret", str(ca_file) if with_ca else None)

    sink = kube_progress.KubernetesProgressSink(target, "team", "job", interval=0.05, max_backoff=0.1)
    sink.emit(MetricsRecord("step", 1, 10, loss=2.0))
    sink.close(flush_timeout=5)
    if with_ca:
        assert (sink.patches_sent, sink.failures) == (1, 0)
        path = "/apis/llmtrain.dev/v1alpha1/namespaces/team/llmtrainingjobs/job/status"
        assert _StatusServer.seen == [(path, "Bearer secret")]
    else:  # the private CA is not among the system's: the certificate cannot be verified
        assert (sink.patches_sent, _StatusServer.seen) == (0, []) and sink.failures >= 1
        assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


# ----------------------------------------------------------------------------- llmtrain run


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started")

    monkeypatch.setattr("ray.init", forbidden)


def write_job(tmp_path: Path, **spec_changes: Any) -> Path:
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"]["dataset"]["path"] = str(REPO / "examples" / "data" / "tiny-stories.txt")
    job["spec"].update(spec_changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_run_local_rejects_an_invalid_job(
    tmp_path: Path, no_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, strategy={"type": "fsdp", "deepspeed": {"zeroStage": 3}})
    assert local.run_local(job, tmp_path / "runs") == 2
    assert "strategy.deepspeed" in capsys.readouterr().out


def test_a_local_run_is_keyed_on_the_job_file(tmp_path: Path) -> None:
    """The same file resumes its run; another file with the same job name starts its own."""
    job = write_job(tmp_path)
    other = job.with_name("other.yaml")
    other.write_text(job.read_text())
    runs = tmp_path / "runs"
    first = Path(local.load_job_config(job, runs, use_gpu=False).run_dir)
    assert first == Path(local.load_job_config(job, runs, use_gpu=False).run_dir) == runs / "tiny-cpu" / "job"
    assert Path(local.load_job_config(other, runs, use_gpu=False).run_dir) == runs / "tiny-cpu" / "other"


def test_run_local_says_a_finished_run_is_finished(
    tmp_path: Path, no_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "tiny-cpu" / "job"  # <job name>/<job file stem>
    run_dir.mkdir(parents=True)
    records = [
        MetricsRecord("step", 1, 120, loss=6.0),
        MetricsRecord("step", 50, 120, loss=9.9),  # from an attempt that died after its checkpoint at 40
        MetricsRecord("resumed", 40, 120),
        MetricsRecord("step", 50, 120, loss=3.0),
        MetricsRecord("step", 120, 120, loss=2.5),
    ]
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    (run_dir / RESULT_FILE).write_text(json.dumps({"finished": True, "steps": 120, "resumed_from_step": 40}))
    assert local.run_local(write_job(tmp_path), tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert "already finished" in out and "--fresh" in out
    summary = local.build_summary(run_dir, None)
    assert (summary["initial_loss"], summary["final_loss"], summary["resumed_from_step"]) == (6.0, 2.5, 40)
    local.plot_loss_curve(run_dir, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000

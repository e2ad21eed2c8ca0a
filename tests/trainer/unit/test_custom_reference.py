"""A bad trainer.custom.function (missing module or function, a module that fails to import, a
wrong signature) or an unknown Hugging Face pass-through argument fails the entrypoint before any
Ray worker starts, with a message naming the reference."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from llmtrain_trainer.kube_progress import API_SERVER_ENV
from llmtrain_trainer.main import main

from tests.support.trainer import tiny_config, write_config

MODULE = """
def train(ctx):
    pass

def two(ctx, extra):
    pass

def keywords_only(*, ctx):
    pass

not_a_function = 3
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "user_train.py").write_text(MODULE)
    (folder / "broken_train.py").write_text("import not_installed_package_xyz\n")
    return folder


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("missing_module_xyz:train", "no module named 'missing_module_xyz'"),
        ("user_train:nope", "module user_train has no 'nope'"),
        ("user_train:not_a_function", "not_a_function is not callable"),
        ("user_train:two", "must accept exactly one argument"),
        ("user_train:keywords_only", "must accept exactly one argument"),
        ("broken_train:train", "importing broken_train failed: No module named 'not_installed_package_xyz'"),
    ],
)
def test_bad_reference_fails_before_workers_start(
    tmp_path: Path, code: Path, capsys: pytest.CaptureFixture[str], function: str, expected: str
) -> None:
    config = tiny_config(
        tmp_path / "runs",
        "bad-ref",
        trainer={"type": "custom", "custom": {"function": function, "path": str(code)}},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    err = capsys.readouterr().err
    assert f"trainer.custom.function {function!r}" in err and expected in err, err
    run = tmp_path / "runs" / "bad-ref"
    written = sorted(str(p.relative_to(run)) for p in run.rglob("*")) if run.exists() else []
    assert written in ([], ["logs", "logs/driver.log"]), f"no run was started, only its log: {written}"


def test_good_reference_passes_preflight(tmp_path: Path, code: Path) -> None:
    from llmtrain_trainer.preflight import check

    check(
        tiny_config(
            tmp_path / "r",
            "ok",
            trainer={"type": "custom", "custom": {"function": "user_train:train", "path": str(code)}},
        )
    )


def test_missing_path_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config(
        tmp_path / "runs",
        "p",
        trainer={"type": "custom", "custom": {"function": "m:f", "path": str(tmp_path / "no")}},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    assert "trainer.custom.path" in capsys.readouterr().err


def test_unknown_hf_argument_fails_preflight(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config(
        tmp_path / "runs",
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface", "huggingface": {"args": {"optimm": "sgd"}}},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    assert "trainer.huggingface.args ['optimm']" in capsys.readouterr().err


def test_llmtrain_run_names_a_bad_reference_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml
    from llmtrain_trainer.local import run_local

    from tests.support.trainer import REPO

    job = yaml.safe_load((REPO / "examples" / "tiny-cpu-custom.yaml").read_text())
    job["spec"]["trainer"]["custom"] = {
        "function": "tiny_train:missing",
        "path": str(REPO / "examples/custom"),
    }
    job["spec"]["dataset"]["path"] = str(REPO / "examples/data/tiny-stories.txt")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert run_local(tmp_path / "job.yaml", tmp_path / "runs") == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "trainer.custom.function 'tiny_train:missing'" in out and "has no 'missing'" in out, out


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A stand-in for the API server's status endpoint: records every PATCH (path, body)."""
    patches: list[tuple[str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            patches.append((self.path, json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", patches
    finally:
        server.shutdown()
        thread.join()


def test_a_preflight_error_reaches_the_job_status(
    tmp_path: Path,
    code: Path,
    monkeypatch: pytest.MonkeyPatch,
    api_server: tuple[str, list[tuple[str, dict[str, Any]]]],
) -> None:
    """In a cluster the entrypoint's stderr is only in the RayJob's logs: the reason a run cannot
    start goes to status.progress.error, as a training failure's root cause does."""
    url, patches = api_server
    monkeypatch.setenv(API_SERVER_ENV, url)
    config = tiny_config(
        tmp_path / "runs",
        "bad-ref",
        trainer={"type": "custom", "custom": {"function": "user_train:nope", "path": str(code)}},
        progress={"reportToKubernetes": True},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    errors = [(path, body["status"]["progress"].get("error")) for path, body in patches]
    assert errors, "nothing was reported"
    path, error = errors[-1]
    assert path.endswith("/namespaces/test/llmtrainingjobs/bad-ref/status"), path
    assert error is not None and "trainer.custom.function 'user_train:nope'" in error, error


def test_a_function_from_the_trainer_image_needs_no_path(
    tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without trainer.custom.path the module is imported as installed in the image (here: a folder
    on sys.path standing in for site-packages); preflight and the workers resolve the same function."""
    import importlib

    from llmtrain.api.trainer_spec import CustomTrainerSpec
    from llmtrain_trainer.modes.reference import resolve
    from llmtrain_trainer.preflight import check

    monkeypatch.syspath_prepend(str(code))
    spec = CustomTrainerSpec(function="user_train:train")
    assert spec.path is None
    assert resolve(spec) is importlib.import_module("user_train").train
    check(
        tiny_config(
            tmp_path / "r", "image", trainer={"type": "custom", "custom": {"function": "user_train:train"}}
        )
    )


def test_a_missing_module_without_path_names_the_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(
        tmp_path / "runs",
        "image",
        trainer={"type": "custom", "custom": {"function": "not_in_image_xyz:train"}},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    assert "no module named 'not_in_image_xyz' in the trainer image" in capsys.readouterr().err


def test_hf_mode_refuses_a_weights_only_resume_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CRD refuses it too (CEL); a TrainerConfig written by hand or by an older operator still
    fails before workers start, naming spec.resumeFrom and what to use instead."""
    seed = tmp_path / "seeds" / "checkpoint-step-00000010"
    seed.mkdir(parents=True)
    config = tiny_config(
        tmp_path / "runs",
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        resumeFrom={"runsRoot": str(tmp_path / "runs"), "checkpoint": str(seed)},
    )
    assert main(["--config", str(write_config(config, tmp_path / "c.json"))]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "spec.resumeFrom.checkpoint (weights only) is not supported with trainer.type huggingface" in err
    assert "use resumeFrom.run" in err

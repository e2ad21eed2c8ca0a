"""Real experiment trackers for the tracking tests, and readers of what they stored.

- `mlflow_server`: an MLflow tracking server (PyPI `mlflow`: its `mlflow server` command) on
  127.0.0.1 with a sqlite backend in a temporary folder, stopped with the test;
- `tensorboard_scalars`: TensorBoard's own event reader (`EventAccumulator`) over a log folder;
- `wandb_offline_history`: the history rows and config of W&B offline runs, read from their
  `.wandb` files with W&B's own record reader.
"""

from __future__ import annotations

import json
import struct
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.cluster.processes import free_port
from tests.support.servers import listening


def _as_is(argv: list[str]) -> list[str]:
    return argv


@contextmanager
def mlflow_server(
    folder: Path,
    timeout: float = 120.0,
    *,
    host: str = "127.0.0.1",
    enter: Callable[[list[str]], list[str]] = _as_is,
) -> Iterator[str]:
    """A tracking server on `host` (one worker: the machine's CPUs are scarce); yields its URL.
    With `enter` (a real node's `NodeNetwork.enter`) it listens on the node's IP inside the node's
    network namespace, where the node's pods reach it."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://{host}:{port}"
    command = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root",
        str(folder / "artifacts"),
    ]
    with listening(
        "mlflow server",
        enter(command),
        port,
        folder / "server.log",
        timeout=timeout,
        host=host,
        ready=lambda: _healthy(url),
    ):
        yield url


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def mlflow_runs(url: str, experiment: str) -> list[Any]:
    """Every run of `experiment` on the server, through MLflow's client."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} on {url}"
    return list(client.search_runs([found.experiment_id]))


def mlflow_history(url: str, run_id: str, metric: str) -> dict[int, float]:
    """Step → value of one metric of a run, as the server stored it."""
    from mlflow import MlflowClient

    history = MlflowClient(url).get_metric_history(run_id, metric)
    steps = [m.step for m in history]
    assert len(steps) == len(set(steps)), f"{metric} logged twice for a step: {sorted(steps)}"
    return {m.step: m.value for m in history}


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag → (step, value) of every scalar in the folder's event files, in the order written, by
    TensorBoard's reader (a step written twice shows twice)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def once_per_step(points: list[tuple[int, float]]) -> dict[int, float]:
    """Step → value of a series that must hold each step once."""
    steps = [step for step, _ in points]
    assert len(steps) == len(set(steps)), f"a step written twice: {sorted(steps)}"
    return dict(points)


def tensorboard_texts(log_dir: Path) -> dict[str, str]:
    """Tag → the latest text summary (add_text), by TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    texts = {}
    for tag in accumulator.Tags()["tensors"]:
        if tag.endswith("/text_summary"):
            tensor = accumulator.Tensors(tag)[-1].tensor_proto
            texts[tag.removesuffix("/text_summary")] = tensor.string_val[0].decode()
    return texts


def wandb_offline_runs(folder: Path) -> list[Path]:
    """The `.wandb` files of the offline runs W&B wrote under `<folder>/wandb`."""
    return sorted((folder / "wandb").glob("offline-run-*/run-*.wandb"))


# W&B's transaction log: the header ":W&B", magic 0xBEE1 and version 0, then LevelDB's log format
# (32 KiB blocks of records framed by a CRC, a length and a type: whole, first, middle or last).
_WANDB_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK = 32 * 1024


def _wandb_log_entries(run_file: Path) -> Iterator[bytes]:
    data = run_file.read_bytes()
    ident, magic, version = _WANDB_HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{run_file} is not a W&B run file"
    position, pending = _WANDB_HEADER.size, b""
    while position + _CHUNK_HEADER.size <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _CHUNK_HEADER.size:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = _CHUNK_HEADER.unpack_from(data, position)
        if kind == 0:
            break
        chunk = data[position + _CHUNK_HEADER.size : position + _CHUNK_HEADER.size + length]
        position += _CHUNK_HEADER.size + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        else:
            yield pending + chunk
            pending = b""


def wandb_offline_history(run_file: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The history rows (key → value) and the config (key → value) of an offline run file, each
    entry decoded with W&B's own record protobuf (`wandb_internal_pb2.Record`)."""
    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for entry in _wandb_log_entries(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(entry)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({_key(item): json.loads(item.value_json) for item in updates})
    return rows, config


def _key(item: Any) -> str:
    return str(item.key) if item.key else "/".join(item.nested_key)

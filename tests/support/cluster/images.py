"""Tiny OCI images made here, for a node that can reach no registry.

containerd needs its sandbox ("pause") image locally before any pod can start, and the smoke test
and local-path's helper pods need a shell. Both are made from what this machine has: a static
pause binary compiled from the C below with gcc, and Debian's busybox-static. Each becomes an OCI
image-layout tar (one layer, a config, a manifest, index.json naming the image), the format
`ctr images import` reads. Archives are cached by content under `$LLMTRAIN_CACHE/images/`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "localhost/llmtrain/pause:1"
BUSYBOX_IMAGE = "localhost/llmtrain/busybox:1"
BUSYBOX_BINARY = Path("/bin/busybox")

# The sandbox process: holds the pod's namespaces, reaps orphans, exits on SIGTERM/SIGINT.
PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def _cache() -> Path:
    import build_tools  # hack/tools, put on sys.path by tests.support.cluster.cluster

    path: Path = build_tools.cache_root() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def layer_tar(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    """A gzip layer tar, reproducible: fixed mtimes and owners, sorted entries."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for d in dirs:
            parts = Path(d).parts
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name not in tar.getnames():
                    info = tarfile.TarInfo(name)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for name, target in sorted(links.items()):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return raw.getvalue()


def write_oci_archive(
    out: Path, name: str, layer: bytes, *, entrypoint: list[str], cmd: list[str] | None = None
) -> Path:
    """An OCI image-layout tar of one layer; index.json names it `name` for `ctr images import`."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    compressed = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created_by": "tests/support/cluster/images.py"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(_json(config))},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(compressed)}],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **blob(_json(manifest)),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w") as tar:
        entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        entries.update({f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()})
        for entry, data in entries.items():
            info = tarfile.TarInfo(entry)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(out)
    return out


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def pause_archive() -> Path:
    """The sandbox image: the static pause binary built from PAUSE_C with gcc."""
    key = hashlib.sha256(PAUSE_C.encode() + PAUSE_IMAGE.encode()).hexdigest()[:12]
    out = _cache() / f"pause-{key}.oci.tar"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        subprocess.run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(src)], check=True)
        layer = layer_tar({"pause": (binary.read_bytes(), 0o755)}, {})
    return write_oci_archive(out, PAUSE_IMAGE, layer, entrypoint=["/pause"])


def busybox_archive() -> Path:
    """A shell image: Debian's static busybox as /bin/busybox with a link for each applet."""
    data = BUSYBOX_BINARY.read_bytes()
    key = hashlib.sha256(data + BUSYBOX_IMAGE.encode()).hexdigest()[:12]
    out = _cache() / f"busybox-{key}.oci.tar"
    if out.exists():
        return out
    applets = subprocess.run(
        [str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox"}
    layer = layer_tar({"bin/busybox": (data, 0o755)}, links)
    return write_oci_archive(out, BUSYBOX_IMAGE, layer, entrypoint=["/bin/sh"])


def store_dir() -> Path:
    """The real node's shared image store (containerd's root and its lock), kept between sessions."""
    return _cache().parent / "containerd"


def archive_image(archive: Path) -> tuple[str | None, str | None]:
    """The image name and manifest digest an OCI archive's index.json gives (None, None when it
    names none, or for a docker-save archive): what `ctr images import` will list it as."""
    with tarfile.open(archive, "r:") as tar:
        try:
            member = tar.extractfile("index.json")
        except KeyError:
            return None, None
        index = json.load(member) if member else {}
    for manifest in index.get("manifests", []):
        annotations = manifest.get("annotations") or {}
        name = annotations.get("io.containerd.image.name")
        ref = annotations.get("org.opencontainers.image.ref.name", "")
        if not name and "/" in ref:
            name = ref
        if name:
            return str(name), str(manifest["digest"])
    return None, None


def _ctr(ctr: str, address: str, *args: str, timeout: float = 120) -> str:
    cmd = [ctr, f"--address={address}", "-n", "k8s.io", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def listed(ctr: str, address: str) -> dict[str, str]:
    """Image name -> manifest (or index) digest, as containerd's k8s.io namespace has them."""
    lines = _ctr(ctr, address, "images", "ls").splitlines()[1:]
    return {f[0]: f[2] for f in (line.split() for line in lines) if len(f) > 2}


def remove(ctr: str, address: str, names: list[str]) -> None:
    """Delete images; containerd's garbage collector then frees their layers and snapshots."""
    if names:
        _ctr(ctr, address, "images", "rm", *names)


def tag(ctr: str, address: str, source: str, target: str) -> None:
    """Give an image a second name (replacing what that name pointed at)."""
    _ctr(ctr, address, "images", "tag", "--force", source, target)


def import_archive(ctr: str, address: str, archive: Path, timeout: float | None = None) -> None:
    """`ctr -n k8s.io images import`: the CRI's namespace, unpacked for its snapshotter. Layer
    blobs are dropped once unpacked (containers run from the snapshots; a multi-GB trainer image
    would otherwise take its size twice in the store); ctr allows that only with `--local` (the
    import runs in ctr rather than through containerd's transfer service). The default timeout
    grows with the archive (written twice: its blobs, then the snapshots) at a pessimistic 5 MB/s."""
    if timeout is None:
        timeout = 120 + archive.stat().st_size / 5e6
    args = ["images", "import", "--local", "--discard-unpacked-layers", str(archive)]
    _ctr(ctr, address, *args, timeout=timeout)

"""Build the operator and trainer images with buildah, FROM Debian bases made here, cached by content.

There is no image registry here, so the published bases (python:*-slim, nvidia/cuda:*) are replaced
by bases made from Debian packages with mmdebstrap (the mirror /etc/apt is configured with), passed
to the unchanged Dockerfiles as build arguments. The trainer's CUDA devel base gets the CUDA runtime
headers and static cudart from PyPI's nvidia-cuda-runtime wheel (what torch's CUDA build depends
on), which is what the aws-ofi-nccl plugin compiles against.

Each image is stored as an OCI archive (uncompressed layers; `ctr -n k8s.io images import` takes it)
at `$LLMTRAIN_CACHE/images/<name>-<key>.tar` (default `~/.cache/llmtrain`), where the key hashes
the Dockerfile, the files it copies from the build context, the build arguments and the bases'
recipes: a second run, or another clone on the same machine, reuses it. buildah's layer cache
(`--layers`, in /var/lib/containers) makes a code change rebuild only the small top layers.

Usage: `python hack/images.py [operator|trainer ...]` builds what is missing and prints each
archive with its size. Each image is a chain (its bases, then the image) and the chains build side
by side, each line of their output prefixed with `[name]` (the operator's python base and image do
not wait for the trainer's CUDA bases and its long build). Other code calls `ensure(name)` (the
archive) or `local_ref(name)` (the image in buildah's storage, for `buildah from`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llmtrain.constants import OPERATOR_IMAGE_REPOSITORY, TRAINER_IMAGE_REPOSITORY, VERSION

REPO_ROOT = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
HOST_PACKAGES = ("buildah", "mmdebstrap")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The CUDA 13.0 runtime torch 2.13's PyPI build depends on (headers, libcudart_static.a) and the
# crt/ headers cuda_runtime_api.h includes: what the fabric stage's `--with-cuda=/usr/local/cuda`
# compiles and links against.
CUDA_WHEELS = ("nvidia-cuda-runtime==13.0.96", "nvidia-cuda-crt==13.0.88")
CUDA_DIR = "/usr/local/cuda-13.0"
# What the nvidia/cuda images set: the NVIDIA container toolkit mounts the driver's libraries there.
NVIDIA_ENV = {
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
}
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AWS_OFI_NCCL_VERSION = re.compile(r"^ARG AWS_OFI_NCCL_VERSION=(\S+)$", re.M)
AWS_OFI_NCCL_SHA256 = re.compile(r"^ARG AWS_OFI_NCCL_SHA256=([0-9a-f]{64})$", re.M)


@dataclass(frozen=True)
class Base:
    """A stand-in for a published base image: Debian packages (and the CUDA wheel's files)."""

    packages: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cuda: bool = False


@dataclass(frozen=True)
class Image:
    dockerfile: str
    repository: str
    bases: dict[str, str]  # build argument -> key of BASES
    build_args: dict[str, str] = field(default_factory=dict)


BASES = {
    # python:3.11-slim: Debian's python3 (3.11 in bookworm) with venv and the `python` name.
    "python": Base(("python3", "python3-venv", "python-is-python3", "ca-certificates")),
    # nvidia/cuda:*-runtime: the CUDA libraries come with torch's wheels, the driver from the node.
    "cuda-runtime": Base(("ca-certificates",), env=NVIDIA_ENV),
    "cuda-devel": Base(("ca-certificates",), env=NVIDIA_ENV, cuda=True),
}

IMAGES = {
    "operator": Image("operator/Dockerfile", OPERATOR_IMAGE_REPOSITORY, {"PYTHON_IMAGE": "python"}),
    "trainer": Image(
        "trainer_image/Dockerfile",
        TRAINER_IMAGE_REPOSITORY,
        {"CUDA_DEVEL_IMAGE": "cuda-devel", "CUDA_RUNTIME_IMAGE": "cuda-runtime"},
        # PyPI's torch is the CUDA build (it runs on CPU too); the devel base has no nvcc.
        {"TORCH_INDEX": "https://pypi.org/simple", "DS_BUILD_FUSED_ADAM": "0"},
    ),
}


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmtrain"
    return Path(os.environ.get("LLMTRAIN_CACHE", default))


def images_dir() -> Path:
    return cache_root() / "images"


def _sha(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------ the keys


def base_key(name: str) -> str:
    """The base's recipe and the Debian mirror it comes from (a rebuild of the same recipe later
    may get newer point releases; the cached base is kept until its recipe changes)."""
    base = BASES[name]
    sources = APT_SOURCES.read_text() if APT_SOURCES.exists() else ""
    recipe = {
        "suite": SUITE,
        "packages": base.packages,
        "env": base.env,
        "cuda": [*CUDA_WHEELS, CUDA_DIR] if base.cuda else None,
        "sources": sources,
    }
    return _sha(recipe)[:16]


def base_ref(name: str) -> str:
    return f"localhost/llmtrain/base-{name}:{base_key(name)}"


def _ignored(relative: Path, patterns: list[str]) -> bool:
    """A `**/PATTERN` line of .dockerignore matches any path component (all it uses)."""
    return any(fnmatch.fnmatch(part, p) for p in patterns for part in relative.parts)


def context_files(dockerfile: str, root: Path = REPO_ROOT) -> list[Path]:
    """The files the Dockerfile copies from the build context (COPY without --from), less what
    .dockerignore's `**/` patterns leave out, relative to the root."""
    ignore = (root / ".dockerignore").read_text() if (root / ".dockerignore").exists() else ""
    patterns = [line[3:] for line in ignore.splitlines() if line.startswith("**/")]
    text = (root / dockerfile).read_text().replace("\\\n", " ")
    files: set[Path] = set()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        args = [a for a in line.split() if not a.startswith("--")]
        if "--from=" in line:
            continue
        for source in args[:-1]:
            path = root / source
            found = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            files |= {p.relative_to(root) for p in found if not _ignored(p.relative_to(root), patterns)}
    return sorted(files)


def build_args(name: str, root: Path = REPO_ROOT) -> dict[str, str]:
    image = IMAGES[name]
    args = {arg: base_ref(base) for arg, base in image.bases.items()} | image.build_args
    if name == "trainer" and not _fabric_in_context(root):
        args["AWS_OFI_NCCL_SOURCE"] = "none"  # no GitHub here: built without the plugin
    return args


def image_key(name: str, root: Path = REPO_ROOT) -> str:
    """What the image is made of: the Dockerfile, each copied file (path and bytes), .dockerignore
    and the build arguments (which name the bases by their recipe's key)."""
    image = IMAGES[name]
    digest = hashlib.sha256()
    digest.update((root / image.dockerfile).read_bytes())
    ignore = root / ".dockerignore"
    digest.update(ignore.read_bytes() if ignore.exists() else b"")
    for relative in context_files(image.dockerfile, root):
        digest.update(f"\0{relative}\0".encode())
        digest.update((root / relative).read_bytes())
    digest.update(json.dumps(build_args(name, root), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def ref(name: str, key: str | None = None) -> str:
    """The name the archive carries (org.opencontainers.image.ref.name), which `ctr images import`
    gives the image: the published repository, tagged with the content key."""
    return f"{IMAGES[name].repository}:local-{key or image_key(name)}"


def published_ref(name: str) -> str:
    """The name the chart's defaults run (`<repository>:<appVersion>`). A cluster with no registry
    gets the local build under it too, so the README's `helm install` works there unchanged."""
    return f"{IMAGES[name].repository}:{VERSION}"


def archive_path(name: str, key: str | None = None) -> Path:
    return images_dir() / f"{name}-{key or image_key(name)}.tar"


# --------------------------------------------------------------------------- aws-ofi-nccl source


def fabric_archive_name(root: Path = REPO_ROOT) -> tuple[str, str]:
    """(aws-ofi-nccl-<version>.tar.gz, its pinned sha256) from the trainer's Dockerfile."""
    text = (root / IMAGES["trainer"].dockerfile).read_text()
    version, sha = AWS_OFI_NCCL_VERSION.search(text), AWS_OFI_NCCL_SHA256.search(text)
    if not version or not sha:
        raise SystemExit("trainer_image/Dockerfile: no AWS_OFI_NCCL_VERSION/AWS_OFI_NCCL_SHA256")
    return f"aws-ofi-nccl-{version.group(1)}.tar.gz", sha.group(1)


def _fabric_in_context(root: Path) -> bool:
    name, _ = fabric_archive_name(root)
    return (root / "trainer_image" / "fabric" / name).is_file()


def stage_fabric_source(root: Path = REPO_ROOT) -> bool:
    """Copy the aws-ofi-nccl release archive from `$LLMTRAIN_CACHE/sources/` into the build context
    when it is there with the pinned checksum (GitHub, where the Dockerfile fetches it from, is not
    reachable here). Returns whether the context has it."""
    name, sha = fabric_archive_name(root)
    target = root / "trainer_image" / "fabric" / name
    cached = cache_root() / "sources" / name
    if not target.is_file() and cached.is_file():
        if hashlib.sha256(cached.read_bytes()).hexdigest() != sha:
            raise SystemExit(f"{cached}: not the sha256 trainer_image/Dockerfile pins ({sha})")
        shutil.copyfile(cached, target)
    return target.is_file()


# ----------------------------------------------------------------------------------- building


_chain = threading.local()  # .prefix: "[name] " beside another chain; .tail: its last lines
TAIL_LINES = 30
_say_lock = threading.Lock()


def _say(line: str) -> None:
    """Print one line, prefixed with the chain's name when chains build side by side."""
    with _say_lock:
        sys.stdout.write(f"{getattr(_chain, 'prefix', '')}{line}\n")
        sys.stdout.flush()
    if (tail := getattr(_chain, "tail", None)) is not None:
        tail.append(line)


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command: its output captured (capture_output=True), else printed line by line."""
    if kwargs.get("capture_output"):
        _say("+ " + shlex.join(cmd))
        return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]
    return subprocess.CompletedProcess(cmd, 0, build_teed(cmd, **kwargs))  # type: ignore[arg-type]


def _quiet(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


# `buildah build --layers` ends each step with `--> ID` (committed) or `--> Using cache FULL-ID`.
_STEP_IMAGE = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", re.M)


def step_images(build_output: str) -> list[str]:
    """The step images a layered build made or reused, in build order, as 11-digit ID prefixes
    (buildah prints committed IDs that short): the layer cache the next build may use."""
    return list(dict.fromkeys(found[:11] for found in _STEP_IMAGE.findall(build_output)))


def build_teed(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a build, printing its output as it comes and returning it (for `step_images`)."""
    _say("+ " + shlex.join(cmd))
    lines: list[str] = []
    with subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            _say(line.rstrip("\n"))
            lines.append(line)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, "".join(lines[-50:]))
    return "".join(lines)


def superseded(previous: list[str], current: list[str], kept: set[str]) -> list[str]:
    """The previous build's step images that neither this build nor another image's build uses,
    children before parents (an image with a child left cannot be removed)."""
    return [image for image in reversed(previous) if image not in current and image not in kept]


def prune_step_images(images: list[str]) -> list[str]:
    """Remove superseded step images from buildah's storage, so that a long-lived machine keeps one
    layer cache per image instead of one per dependency change (each several GB for the trainer).
    Tagged images are never removed. Returns what was removed."""
    listing = _quiet(["buildah", "images", "--all", "--no-trunc", "--format", "{{.ID}} {{.Name}}"]).stdout
    tagged = {
        line.split()[0].removeprefix("sha256:")[:11]
        for line in listing.splitlines()
        if line.split()[1:] != ["<none>"]
    }
    removed = []
    for image in images:
        if image not in tagged and _quiet(["buildah", "rmi", image]).returncode == 0:
            removed.append(image)
    return removed


def ensure_host_tools() -> None:
    """buildah and mmdebstrap are Debian packages: install them as root when missing."""
    with _host_tools_lock:  # two chains may ask at once: one apt-get
        _install_host_tools()


_host_tools_lock = threading.Lock()


def _install_host_tools() -> None:
    missing = [p for p in HOST_PACKAGES if not shutil.which(p)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(f"building images needs {', '.join(missing)} (Debian packages)")
    _run(["apt-get", "update", "-qq"])
    _run(
        ["apt-get", "install", "-y", "-qq", *HOST_PACKAGES],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def _in_storage(reference: str) -> bool:
    return _quiet(["buildah", "inspect", "--type", "image", reference]).returncode == 0


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """One build of an image (or base) at a time per cache: make images and a test session may
    both ask; another image builds meanwhile."""
    images_dir().mkdir(parents=True, exist_ok=True)
    with (images_dir() / f".lock-{name}").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _cuda_tree(stage: Path) -> None:
    """/usr/local/cuda from the CUDA wheels: include/, lib/ (lib64 -> lib), libcudart.so."""
    wheels = stage / "wheels"
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", "-d", str(wheels), *CUDA_WHEELS]
    )  # fmt: skip
    root = stage / "root"
    cuda = root / CUDA_DIR.lstrip("/")
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                match = re.match(r"nvidia/cu\d+/((?:include|lib)/.+)$", member)
                if match and not member.endswith("/"):
                    target = cuda / match.group(1)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(member))
    (cuda / "lib64").symlink_to("lib")
    (cuda / "lib" / "libcudart.so").symlink_to(next((cuda / "lib").glob("libcudart.so.*")).name)
    (root / "usr" / "local" / "cuda").symlink_to(Path(CUDA_DIR).name)


def _build_base(name: str) -> None:
    """mmdebstrap a minimal Debian, then commit it as an image with the base's environment."""
    base = BASES[name]
    with tempfile.TemporaryDirectory(prefix=f"llmtrain-base-{name}-", dir=images_dir()) as tmp:
        stage = Path(tmp)
        rootfs = stage / "rootfs.tar"
        hooks: list[str] = []
        if base.cuda:
            _cuda_tree(stage)
            hooks = [f'--customize-hook=cp -a {shlex.quote(str(stage / "root"))}/. "$1"/']
        _run(
            ["nice", "-n", "10", "mmdebstrap", "--quiet", "--variant=minbase",
             f"--include={','.join(base.packages)}",
             "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
             "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
             "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*",
             *hooks, SUITE, str(rootfs), str(APT_SOURCES)]
        )  # fmt: skip
        container = _run(["buildah", "from", "scratch"], capture_output=True).stdout.strip()
        try:
            _run(["buildah", "add", "--quiet", container, str(rootfs), "/"], capture_output=True)
            env = {"PATH": PATH_ENV, "LANG": "C.UTF-8"} | base.env
            config = [arg for k, v in env.items() for arg in ("--env", f"{k}={v}")]
            _run(["buildah", "config", *config, "--cmd", '["bash"]', container])
            _run(["buildah", "commit", "--quiet", "--rm", container, base_ref(name)], capture_output=True)
        except BaseException:
            _quiet(["buildah", "rm", container])
            raise


def ensure_base(name: str) -> str:
    """The base in buildah's storage: loaded from its archive, or made."""
    reference = base_ref(name)
    with _lock(f"base-{name}"):
        if _in_storage(reference):
            return reference
        archive = images_dir() / f"base-{name}-{base_key(name)}.tar"
        if archive.is_file():
            _run(["buildah", "pull", "--quiet", f"oci-archive:{archive}"], capture_output=True)
            _run(["buildah", "tag", _loaded_id(archive), reference])
            return reference
        started = time.monotonic()
        _build_base(name)
        _push(reference, archive, reference)
    _say(f"base {name}: {time.monotonic() - started:.0f} s, {archive.stat().st_size / 1e6:.0f} MB")
    return reference


def _loaded_id(archive: Path) -> str:
    """The image ID (config digest) of an OCI archive that was just pulled."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "-xf", str(archive), "-C", tmp, "index.json"], check=True)
        index = json.loads((Path(tmp) / "index.json").read_text())
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        subprocess.run(["tar", "-xf", str(archive), "-C", tmp, f"blobs/sha256/{manifest_digest}"], check=True)
        manifest = json.loads((Path(tmp) / "blobs" / "sha256" / manifest_digest).read_text())
    return str(manifest["config"]["digest"].split(":")[1])


def _push(reference: str, archive: Path, name_in_archive: str) -> None:
    """Write the image as an OCI archive, atomically (a crash leaves no half archive behind)."""
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    _run(
        ["nice", "-n", "10", "buildah", "push", "--quiet", "--disable-compression",
         reference, f"oci-archive:{partial}:{name_in_archive}"],
        capture_output=True,
    )  # fmt: skip
    partial.rename(archive)


def _metadata_path(archive: Path) -> Path:
    return archive.with_suffix(".json")


def metadata(name: str) -> dict[str, object]:
    """What the build recorded: ref, key, size, build seconds, build arguments."""
    return dict(json.loads(_metadata_path(archive_path(name)).read_text()))


def _trust_volumes(tmp: Path) -> list[str]:
    """The build's RUN steps trust the CAs this machine trusts (its HTTPS egress may be intercepted
    by a CA only the host's bundle has): the host's bundle and a pip.conf pointing pip at it, both
    mounted read-only for the build only, never written into a layer."""
    if not HOST_CA_BUNDLE.is_file():
        return []
    pip_conf = tmp / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
    pip_conf.chmod(0o644)
    return ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro"]


def _build(name: str, key: str) -> Path:
    """The image's chain: its bases first, then the image."""
    for base in IMAGES[name].bases.values():
        ensure_base(base)
    return _build_image(name, key)


def _build_image(name: str, key: str) -> Path:
    image = IMAGES[name]
    if name == "trainer":
        stage_fabric_source()
        key = image_key(name)  # the archive in the context is part of the image
    args = build_args(name)
    local = f"localhost/llmtrain/{name}:{key}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        output = build_teed(
            ["nice", "-n", "10", "buildah", "build", "--layers", "--isolation", "chroot", "--pull=never",
             "--force-rm", "-f", image.dockerfile, "-t", local, *_trust_volumes(Path(tmp)),
             *(arg for k, v in args.items() for arg in ("--build-arg", f"{k}={v}")), "."],
            cwd=REPO_ROOT,
        )  # fmt: skip
    built = time.monotonic() - started
    steps = step_images(output)
    archive = archive_path(name, key)
    _push(local, archive, ref(name, key))
    previous: list[str] = []
    for old in images_dir().glob(f"{name}-*.tar"):
        if old != archive:
            with contextlib.suppress(OSError, ValueError):
                previous += json.loads(_metadata_path(old).read_text()).get("step_images", [])
            old.unlink()
            _metadata_path(old).unlink(missing_ok=True)
    for line in _quiet(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"]).stdout.split():
        if line.startswith(f"localhost/llmtrain/{name}:") and line != local:
            _quiet(["buildah", "rmi", line])
    kept = {
        step
        for other in images_dir().glob("*.json")
        if not other.name.startswith(f"{name}-")
        for step in json.loads(other.read_text()).get("step_images", [])
    }
    pruned = prune_step_images(superseded(previous, steps, kept))
    if pruned:
        _say(f"{name}: removed {len(pruned)} superseded step images from buildah's storage")
    record = {
        "ref": ref(name, key),
        "local": local,
        "key": key,
        "bytes": archive.stat().st_size,
        "build_seconds": round(built, 1),
        "archive_seconds": round(time.monotonic() - started - built, 1),
        "build_args": args,
        "step_images": steps,
    }
    # Whole or not at all: the other chain's build reads it (`kept`) meanwhile.
    partial = _metadata_path(archive).with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.rename(_metadata_path(archive))
    return archive


def ensure(name: str) -> Path:
    """The image's OCI archive, built first if its content changed."""
    with _lock(name):
        if name == "trainer":
            stage_fabric_source()
        key = image_key(name)
        archive = archive_path(name, key)
        if archive.is_file():
            return archive
        ensure_host_tools()
        return _build(name, key)


def ensure_all(names: list[str]) -> dict[str, tuple[Path | BaseException, float]]:
    """`ensure` each image in a thread of its own, side by side: (its archive, or what it raised;
    the seconds it took) in the order named. A failed chain does not stop the others."""
    results: dict[str, tuple[Path | BaseException, float]] = {}
    tails: dict[str, deque[str]] = {}

    def chain(name: str) -> None:
        if len(names) > 1:
            _chain.prefix = f"[{name}] "
        _chain.tail = tails[name] = deque(maxlen=TAIL_LINES)
        started = time.monotonic()
        try:
            outcome: Path | BaseException = ensure(name)
        except BaseException as error:  # SystemExit too: reported, and main's status fails
            outcome = error
            _say(f"failed after {time.monotonic() - started:.0f} s: {type(error).__name__}: {error}")
        results[name] = (outcome, time.monotonic() - started)

    threads = [threading.Thread(target=chain, args=(name,), name=name, daemon=True) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in names:
        if not isinstance(results[name][0], Path) and len(names) > 1:
            # Its lines may lie far above the other chain's: again, together, at the end.
            print(f"----- {name} failed; its last lines -----", flush=True)
            print("\n".join(tails[name]), flush=True)
    return {name: results[name] for name in names}


def local_ref(name: str) -> str:
    """The image in buildah's storage (loaded from its archive when the storage lost it)."""
    archive = ensure(name)
    local = str(metadata(name)["local"])
    with _lock(name):
        if not _in_storage(local):
            _run(["buildah", "pull", "--quiet", f"oci-archive:{archive}"], capture_output=True)
            _run(["buildah", "tag", _loaded_id(archive), local])
    return local


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(IMAGES)} (default: all)")
    parser.add_argument("--path", action="store_true", help="print the archive paths only")
    options = parser.parse_args(argv)
    unknown = set(options.names) - set(IMAGES)
    if unknown:
        parser.error(f"unknown image {', '.join(sorted(unknown))}; known: {', '.join(IMAGES)}")
    results = ensure_all(options.names or list(IMAGES))
    for name, (archive, seconds) in results.items():
        if not isinstance(archive, Path):
            continue
        if options.path:
            print(archive)
            continue
        record = metadata(name)
        size = archive.stat().st_size / 2**30
        print(
            f"{name}: {record['ref']}\n  {archive} ({size:.2f} GiB, built in {record['build_seconds']} s;"
            f" this run {seconds:.0f} s)",
            flush=True,
        )
    failed = [name for name, (archive, _) in results.items() if not isinstance(archive, Path)]
    if failed:
        print(f"images.py: {', '.join(failed)} failed (the lines above)", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

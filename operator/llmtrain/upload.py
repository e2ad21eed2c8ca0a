"""`llmtrain upload`: copy a local folder onto a job's shared storage before (or between) runs.

A job reads `dataset.path`, a relative `model.name` and `trainer.custom.path` from its claim, and a
claim made by a storage provisioner starts empty. This puts files there on any cluster, with nothing
but the API server: a short-lived pod mounts the claim, a tar stream goes in through `exec` (as
`kubectl cp` does), the files are listed back and compared with the local ones, and the pod is
deleted. The pod meets the restricted Pod Security profile and runs as the Ray pods' user and
group, so the training pods can read and write what it wrote.
"""

from __future__ import annotations

import io
import os
import secrets
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from llmtrain.constants import DEFAULT_MOUNT_PATH, MANAGED_BY_LABEL, OPERATOR_NAME
from llmtrain.render.rayjob import CONTAINER_SECURITY_CONTEXT, POD_SECURITY_CONTEXT

CHUNK_BYTES = 1 << 20
POD_DEADLINE_SECONDS = 3600  # the pod ends itself even if this process dies mid-copy


class UploadError(RuntimeError):
    """The copy could not be done; the message says what to change."""


@dataclass(frozen=True)
class Target:
    namespace: str
    claim: str
    directory: PurePosixPath  # inside the claim, relative ("." for its root)


def local_files(source: Path) -> dict[str, int]:
    """Relative POSIX path -> size of every regular file under `source` (or `source` itself)."""
    if source.is_file():
        return {source.name: source.stat().st_size}
    if not source.is_dir():
        raise UploadError(f"{source}: no such file or folder")
    return {
        p.relative_to(source).as_posix(): p.stat().st_size
        for p in sorted(source.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def tar_stream(source: Path) -> bytes:
    """An uncompressed tar of `source`'s files (or the file itself), owner-neutral and readable by
    the group: what lands on the volume is shared by every pod of the job's fsGroup."""

    def neutral(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.isdir() else (0o755 if info.mode & 0o100 else 0o644)
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if source.is_file():
            tar.add(source, arcname=source.name, filter=neutral)
        else:
            for name in local_files(source):
                tar.add(source / name, arcname=name, filter=neutral)
    return buffer.getvalue()


def upload_pod(
    target: Target, image: str, name: str, mount_path: str = DEFAULT_MOUNT_PATH, read_only: bool = False
) -> dict[str, Any]:
    """The pod that holds the claim open while the tar goes in (or, `read_only`, while `llmtrain
    logs --saved` reads the trainer's saved logs). Pure, for tests."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": target.namespace,
            "labels": {MANAGED_BY_LABEL: OPERATOR_NAME, "llmtrain.dev/upload": target.claim},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": POD_DEADLINE_SECONDS,
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY_CONTEXT,
            "containers": [
                {
                    "name": "upload",
                    "image": image,
                    "command": ["sleep", str(POD_DEADLINE_SECONDS)],
                    "securityContext": {**CONTAINER_SECURITY_CONTEXT, "readOnlyRootFilesystem": True},
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "1", "memory": "512Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": "storage",
                            "mountPath": mount_path,
                            **({"readOnly": True} if read_only else {}),
                        }
                    ],
                }
            ],
            "volumes": [{"name": "storage", "persistentVolumeClaim": {"claimName": target.claim}}],
        },
    }


def new_claim(namespace: str, name: str, size: str, storage_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: OPERATOR_NAME}},
        "spec": spec,
    }


def check_listing(expected: dict[str, int], listing: str) -> None:
    """Every local file arrived with its size (`find -printf '%P %s\\n'` output)."""
    found: dict[str, int] = {}
    for line in listing.splitlines():
        path, _, size = line.rpartition(" ")
        if path:
            found[path] = int(size)
    wrong = [
        f"{p} ({found.get(p, 'missing')} bytes, expected {s})"
        for p, s in expected.items()
        if found.get(p) != s
    ]
    if wrong:
        raise UploadError("the copy is incomplete: " + ", ".join(wrong[:5]))


class Uploader:
    """The I/O: one pod per upload, always deleted."""

    def __init__(self, core: Any, log: Callable[[str], None] = print) -> None:
        self.core = core  # kubernetes.client.CoreV1Api
        self.log = log

    def ensure_claim(self, namespace: str, claim: str, size: str | None, storage_class: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.read_namespaced_persistent_volume_claim(claim, namespace)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        if size is None:
            raise UploadError(
                f"PersistentVolumeClaim {namespace}/{claim} does not exist; pass --size (e.g. --size 10Gi) "
                "to create it (ReadWriteMany), or name an existing claim"
            )
        self.core.create_namespaced_persistent_volume_claim(
            namespace, new_claim(namespace, claim, size, storage_class)
        )
        self.log(f"created PersistentVolumeClaim {namespace}/{claim} ({size}, ReadWriteMany)")

    def upload(self, source: Path, target: Target, image: str, timeout: float = 600) -> dict[str, int]:
        expected = local_files(source)
        payload = tar_stream(source)
        name = f"llmtrain-upload-{secrets.token_hex(3)}"
        self.core.create_namespaced_pod(target.namespace, upload_pod(target, image, name))
        try:
            self._wait_running(target.namespace, name, timeout)
            directory = str(PurePosixPath(DEFAULT_MOUNT_PATH) / target.directory)
            self._exec(
                target.namespace,
                name,
                ["sh", "-c", 'mkdir -p "$1" && tar -x -f - --no-same-owner -C "$1"', "sh", directory],
                stdin=payload,
            )
            listing = self._exec(
                target.namespace, name, ["find", directory, "-type", "f", "-printf", "%P %s\\n"]
            )
            check_listing(expected, listing)
        finally:
            self.core.delete_namespaced_pod(name, target.namespace, grace_period_seconds=0)
        self.log(
            f"copied {len(expected)} files ({sum(expected.values()):,} bytes) to "
            f"{target.namespace}/{target.claim}:{target.directory}"
        )
        return expected

    def read_files(
        self, target: Target, image: str, mount_path: str, directory: str, name: str, tail: int | None = None
    ) -> tuple[list[str], str]:
        """The file names in `directory` (absolute, inside the pod) and the text of `name` there
        ("" when it is missing), through a pod that mounts the claim read-only at `mount_path`."""
        pod = f"llmtrain-logs-{secrets.token_hex(3)}"
        self.core.create_namespaced_pod(
            target.namespace, upload_pod(target, image, pod, mount_path, read_only=True)
        )
        try:
            self._wait_running(target.namespace, pod, 300)
            listing = self._exec(
                target.namespace,
                pod,
                ["sh", "-c", 'if [ -d "$1" ]; then ls -1 "$1"; fi', "sh", directory],
            ).split()
            if name not in listing:
                return listing, ""
            path = str(PurePosixPath(directory) / name)
            text = self._exec(
                target.namespace, pod, ["tail", "-n", str(tail), path] if tail is not None else ["cat", path]
            )
        finally:
            self.core.delete_namespaced_pod(pod, target.namespace, grace_period_seconds=0)
        return listing, text

    def _wait_running(self, namespace: str, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            pod = self.core.read_namespaced_pod(name, namespace)
            if pod.status.phase == "Running":
                return
            waiting = [
                s.state.waiting for s in (pod.status.container_statuses or []) if s.state and s.state.waiting
            ]
            reason = waiting[0].reason if waiting else None
            if reason in {
                "ErrImagePull",
                "ImagePullBackOff",
                "InvalidImageName",
                "CreateContainerConfigError",
            }:
                raise UploadError(f"upload pod {name}: {reason}: {waiting[0].message or ''}".rstrip(": "))
            if pod.status.phase in {"Failed", "Succeeded"} or time.monotonic() > deadline:
                conditions = "; ".join(
                    f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
                    for c in pod.status.conditions or []
                )
                raise UploadError(
                    f"upload pod {namespace}/{name} is {pod.status.phase} after {timeout:.0f} s"
                    + (f" ({conditions})" if conditions else "")
                )
            time.sleep(1)

    def _exec(self, namespace: str, name: str, command: list[str], stdin: bytes | None = None) -> str:
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import STDIN_CHANNEL

        ws = stream(
            self.core.connect_get_namespaced_pod_exec,
            name,
            namespace,
            command=command,
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )
        out, err = io.BytesIO(), io.BytesIO()
        try:
            if stdin is not None:
                for start in range(0, len(stdin), CHUNK_BYTES):
                    ws.write_stdin(stdin[start : start + CHUNK_BYTES])
                    ws.update(timeout=0)
                    out.write(ws.read_stdout(timeout=0) or b"")
                    err.write(ws.read_stderr(timeout=0) or b"")
                ws.close_channel(STDIN_CHANNEL)  # EOF for tar (the v5 exec protocol)
            while ws.is_open():
                ws.update(timeout=1)
                out.write(ws.read_stdout(timeout=0) or b"")
                err.write(ws.read_stderr(timeout=0) or b"")
            code = ws.returncode
        finally:
            ws.close()
        if code != 0:
            raise UploadError(
                f"`{' '.join(command[:3])}` in the upload pod exited {code}: "
                f"{err.getvalue().decode(errors='replace').strip()[-500:]}"
            )
        return out.getvalue().decode(errors="replace")


def target_for(namespace: str, claim: str | None, job: str | None, to: str, core: Any) -> Target:
    """--claim NAME, or --job NAME (the claim the job mounts: its storage.claimName or created PVC)."""
    directory = PurePosixPath(to)
    if directory.is_absolute() or ".." in directory.parts:
        raise UploadError(f"--to {to!r}: give a path relative to the claim's root (e.g. data)")
    if job is not None:
        from kubernetes import client

        from llmtrain.api.validation import InvalidJob, parse_job
        from llmtrain.constants import API_GROUP, API_VERSION, PLURAL
        from llmtrain.render.storage import claim_name

        raw = client.CustomObjectsApi(core.api_client).get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, job
        )
        try:
            claim = claim_name(parse_job(raw))
        except InvalidJob as exc:
            raise UploadError(f"LLMTrainingJob {namespace}/{job}: {exc}") from exc
    assert claim is not None
    return Target(namespace, claim, directory)


def default_namespace() -> str:
    from kubernetes import config

    try:
        _, context = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str(context.get("context", {}).get("namespace") or "default")
    except Exception:  # in a pod, or no kubeconfig: the client's own default
        return os.environ.get("POD_NAMESPACE", "default")

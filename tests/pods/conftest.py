"""The real-pod tier: one cluster per session with a real node (tests/support/cluster/node.py),
where containers run under containerd and runc, beside kwok's fake GPU nodes.

Pods of this tier select the real node by its label (`on_real_node`); each test gets a namespace
enforcing the restricted Pod Security profile.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION

from hack import images as built
from tests.support import builds
from tests.support.cluster import images, node
from tests.support.cluster.cluster import PLATFORM_NAMESPACE, Cluster
from tests.support.cluster.steps import CHART, RELEASE, helm, wait_for


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    c = Cluster.up(directory, with_kueue=False, real_node=True)
    print(f"\ncluster with a real node up in {time.monotonic() - started:.1f} s ({directory})")
    try:
        yield c
    finally:
        Cluster.down(directory)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = f"p-{request.node.name[:40].lower().replace('_', '-')}"[:50].strip("-") + f"-{digest}"
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    # Its jobs may reference any of its Secrets (the containment policy's default is none).
    meta = {"name": name, "labels": labels, "annotations": {ALLOWED_SECRETS_ANNOTATION: "*"}}
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": meta}])
    # ServiceAccount admission refuses pods until the controller-manager made the default account.
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        what=f"ServiceAccount default in {name}",
    )
    yield name
    # The namespace is marked first (nothing new is admitted into it), then its pods get a 1 s grace
    # period: a shell as PID 1 ignores SIGTERM and would hold each teardown for the default 30 s.
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=false", check=False)
    wait_no_pods(cluster, name)


def wait_no_pods(cluster: Cluster, namespace: str, timeout: float = 180) -> None:
    """Wait until a terminating namespace has no pod left: the next scenario then starts on an
    empty node, not beside pods still holding its CPU. The rest of the namespace (jobs and their
    finalizers, claims and the provisioner's clean-up) goes on in the background: the next
    scenario's own namespace shares none of it, and waiting for it cost 8-15 s a test."""
    deadline = time.monotonic() + timeout
    while True:
        listed = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False)
        if listed.returncode == 0 and not listed.stdout.split():
            return
        assert time.monotonic() < deadline, f"pods of namespace {namespace} still there: {listed.stdout}"
        time.sleep(1)


def on_real_node(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec pinned to the real node (kwok's CPU node would take it otherwise)."""
    return {**spec, "nodeSelector": {node.REAL_NODE_LABEL: "true"}}


def get(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    scope = ["-n", namespace] if namespace else []
    out: dict[str, Any] = json.loads(cluster.kubectl("get", kind, name, *scope, "-o", "json").stdout)
    return out


RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def busybox_pod(name: str, namespace: str, script: str, **spec: Any) -> dict[str, Any]:
    """A busybox pod on the real node running `script` as UID 1000 under the restricted profile;
    `volumes`, `mounts` and `restartPolicy` go to the pod, anything else to its container."""
    volumes = spec.pop("volumes", [])
    mounts = spec.pop("mounts", [])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": on_real_node(
            {
                "restartPolicy": spec.pop("restartPolicy", "Never"),
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "runAsGroup": 1000,
                    "fsGroup": 2000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "main",
                        "image": images.BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", script],
                        "securityContext": RESTRICTED,
                        "volumeMounts": mounts,
                        **spec,
                    }
                ],
                "volumes": volumes,
            }
        ),
    }


@dataclass(frozen=True)
class Release:
    """The chart installed as a user would: the operator a pod from its image on the real node."""

    namespace: str
    operator_image: str
    trainer_image: str
    install_seconds: float


@pytest.fixture(scope="session")
def release(cluster: Cluster) -> Iterator[Release]:
    """One install of the chart for the tier, as the README's `helm install` does it (no values):
    both images are loaded into the node's containerd under the names the chart defaults to, as
    `make cluster` loads them. The platform namespace (whose ServiceAccounts the audit log records)
    enforces the restricted Pod Security profile."""
    started = time.monotonic()
    builds.images_built()
    for name in ("operator", "trainer"):
        cluster.load_image(built.ensure(name), aliases=[built.published_ref(name)])
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    platform = {"name": PLATFORM_NAMESPACE, "labels": labels}
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": platform}])
    helm(cluster, "install", RELEASE, str(CHART), "-n", PLATFORM_NAMESPACE, "--wait", "--timeout=300s")
    installed = time.monotonic() - started
    print(f"\nimages loaded and chart installed in {installed:.1f} s")
    try:
        yield Release(
            PLATFORM_NAMESPACE, built.published_ref("operator"), built.published_ref("trainer"), installed
        )
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", PLATFORM_NAMESPACE, "--wait", "--timeout=120s", check=False)

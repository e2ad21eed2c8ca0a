"""Smoke test of the real node: what only a container that really runs can show.

A pod under the restricted Pod Security profile runs as UID 1000 with seccomp RuntimeDefault, its
fsGroup, a memory-backed /dev/shm and a ReadWriteMany claim provisioned by local-path, and its
output comes back through `kubectl logs` (the API server reaching the kubelet). A second pod finds
a Service by its cluster DNS name (CoreDNS) and fetches from it (kube-proxy, the bridge network).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.pods.conftest import busybox_pod, get
from tests.support.cluster import images, node
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import wait_for


def _phase(cluster: Cluster, name: str, namespace: str) -> str:
    phase: str = get(cluster, "pod", name, namespace)["status"].get("phase", "")
    if phase == "Failed":
        logs = cluster.kubectl("logs", name, "-n", namespace, check=False)
        raise RuntimeError(f"pod {name} failed: {logs.stdout}{logs.stderr}")
    return phase


def test_a_restricted_pod_runs_as_its_user_with_shm_and_a_shared_volume(
    cluster: Cluster, namespace: str
) -> None:
    started = time.monotonic()
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    script = (
        "id -u; id -G; grep '^Seccomp:' /proc/self/status; grep ' /dev/shm ' /proc/mounts; "
        "echo written-by-the-pod > /data/out.txt && echo WROTE"
    )
    pod = busybox_pod(
        "writer",
        namespace,
        script,
        mounts=[{"name": "shm", "mountPath": "/dev/shm"}, {"name": "data", "mountPath": "/data"}],
        volumes=[
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
        ],
    )
    cluster.apply([claim, pod])
    wait_for(
        lambda: _phase(cluster, "writer", namespace) == "Succeeded", timeout=120, what="writer Completed"
    )

    pvc = get(cluster, "pvc", "shared", namespace)
    assert pvc["status"]["phase"] == "Bound"
    assert pvc["spec"]["storageClassName"] == node.STORAGE_CLASS
    assert pvc["status"]["accessModes"] == ["ReadWriteMany"]
    status = get(cluster, "pod", "writer", namespace)["status"]
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"

    logs = cluster.kubectl("logs", "writer", "-n", namespace).stdout.splitlines()
    assert logs[0] == "1000", logs
    assert "2000" in logs[1].split(), logs  # the fsGroup is a supplementary group
    assert logs[2].split() == ["Seccomp:", "2"], logs  # 2 = filter mode: RuntimeDefault applied
    # kubelet's memory emptyDir, not the runtime's default 64 MiB /dev/shm: tmpfs of the size limit.
    assert logs[3].split()[2] == "tmpfs" and "size=131072k" in logs[3], logs
    assert logs[4] == "WROTE", logs

    # The claim is a real folder on the node: the file is there, owned by the pod's user.
    pv = get(cluster, "pv", pvc["spec"]["volumeName"])
    written = Path(pv["spec"]["hostPath"]["path"]) / "out.txt"
    assert written.read_text() == "written-by-the-pod\n"
    assert written.stat().st_uid == 1000
    print(f"\nrestricted pod with shm and RWX claim: {time.monotonic() - started:.1f} s")


def test_a_pod_reaches_a_service_by_its_cluster_dns_name(cluster: Cluster, namespace: str) -> None:
    started = time.monotonic()
    server = busybox_pod(
        "web",
        namespace,
        "echo served-by-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www",
        restartPolicy="Always",
        mounts=[{"name": "www", "mountPath": "/www"}],
        volumes=[{"name": "www", "emptyDir": {}}],
        ports=[{"containerPort": 8080}],
        readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    cluster.apply([server, service])
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/web", "-n", namespace, "--timeout=120s", timeout=130
    )

    fqdn = f"web.{namespace}.svc.cluster.local"
    client = busybox_pod("client", namespace, f"nslookup {fqdn} && wget -q -O - http://{fqdn}/")
    cluster.apply([client])
    wait_for(
        lambda: _phase(cluster, "client", namespace) == "Succeeded", timeout=120, what="client Completed"
    )
    logs = cluster.kubectl("logs", "client", "-n", namespace).stdout
    cluster_ip = get(cluster, "service", "web", namespace)["spec"]["clusterIP"]
    assert cluster_ip in logs, logs  # DNS answered with the Service's ClusterIP
    assert "served-by-web" in logs, logs  # and kube-proxy took the connection to the pod
    print(f"\nService by DNS name: {time.monotonic() - started:.1f} s")


def test_an_image_archive_loads_once_and_replaces_older_tags(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """`Cluster.load_image`: an OCI archive made here runs as a pod; loading it again is skipped
    (the store keeps images between sessions), and a new tag of the repository replaces the old."""
    layer = images.layer_tar({"bin/busybox": (images.BUSYBOX_BINARY.read_bytes(), 0o755)}, {})
    archives = {
        tag: images.write_oci_archive(
            tmp_path / f"probe-{tag}.oci.tar",
            f"localhost/llmtrain/probe:{tag}",
            layer,
            entrypoint=["/bin/busybox", "echo", f"probe-{tag}"],
        )
        for tag in ("a", "b")
    }
    info = node.NodeInfo.load(cluster.directory)
    assert info is not None

    def probes() -> list[str]:
        listed = images.listed(info.ctr, info.containerd_address)
        return sorted(ref for ref in listed if ref.startswith("localhost/llmtrain/probe:"))

    # The store may be the one shared between sessions: start from no probe image.
    images.remove(info.ctr, info.containerd_address, probes())
    assert cluster.load_image(archives["a"])
    assert not cluster.load_image(archives["a"])
    assert cluster.load_image(archives["b"])
    assert probes() == ["localhost/llmtrain/probe:b"]

    pod = busybox_pod("probe", namespace, "unused")
    container = pod["spec"]["containers"][0]
    container["image"] = "localhost/llmtrain/probe:b"
    del container["command"]  # the image's own entrypoint
    cluster.apply([pod])
    wait_for(lambda: _phase(cluster, "probe", namespace) == "Succeeded", timeout=120, what="probe")
    assert cluster.kubectl("logs", "probe", "-n", namespace).stdout == "probe-b\n"

"""KubeRay's operator (a host process) reaching a Ray head that really runs on the real node.

KubeRay asks `http://<cluster>-head-svc.<ns>.svc.cluster.local:8265/api/jobs/<id>` through its
HTTP_PROXY, the cluster tier's dashboard (tests/support/cluster/ray_dashboard.py). For a Service
whose endpoints are on the real node that proxy must reach the Service inside the node's network
namespace and return the head's own answer; for a Service of kwok's pods it keeps answering as
the fake dashboard. Here a busybox httpd on port 8265 plays the head.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from tests.pods.conftest import busybox_pod, get
from tests.support.cluster import nodes
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import wait_for

DASHBOARD_PORT = 8265


def _head_service(name: str, namespace: str, app: str, *, headless: bool = False) -> dict[str, Any]:
    """A head Service; KubeRay's own is headless (DNS gives the pod's address, no ClusterIP)."""
    spec: dict[str, Any] = {
        "selector": {"app": app},
        "ports": [{"name": "dashboard", "port": DASHBOARD_PORT, "targetPort": DASHBOARD_PORT}],
    }
    if headless:
        spec["clusterIP"] = "None"
    metadata = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def _job_through_proxy(cluster: Cluster, service: str, namespace: str, within: float = 90) -> dict[str, Any]:
    """What KubeRay's dashboard client gets: an absolute-URI request through HTTP_PROXY. Asked
    again (as KubeRay's client is, at its next reconcile) until `within` has passed: a Service's
    endpoints read ready before kube-proxy has written its rules, and on a loaded machine a first
    connection to a fresh ClusterIP can hang until then."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": cluster.dashboard}))
    request = urllib.request.Request(
        f"http://{service}.{namespace}.svc.cluster.local:{DASHBOARD_PORT}/api/jobs/probe",
        headers={"x-ray-authorization": "Bearer a-token"},
    )
    deadline = time.monotonic() + within
    while True:
        try:
            with opener.open(request, timeout=10) as response:
                body: dict[str, Any] = json.load(response)
                return body
        except (TimeoutError, urllib.error.URLError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{service}: no answer through the proxy in {within:.0f} s: {exc}"
                ) from exc
            time.sleep(2)


def _endpoint_nodes(cluster: Cluster, service: str, namespace: str) -> set[str]:
    out = cluster.kubectl(
        "get",
        "endpointslices",
        "-n",
        namespace,
        "-l",
        f"kubernetes.io/service-name={service}",
        "-o",
        "json",
    ).stdout
    return {
        e.get("nodeName", "")
        for s in json.loads(out)["items"]
        for e in s.get("endpoints") or []
        if e.get("conditions", {}).get("ready")
    }


def test_the_dashboard_proxy_reaches_a_head_on_the_real_node_and_fakes_kwok_heads(
    cluster: Cluster, namespace: str
) -> None:
    answer = '{"job_id": "probe", "status": "SUCCEEDED", "served_by": "%s"}'
    head = busybox_pod(
        "real-head",
        namespace,
        f"mkdir -p /www/api/jobs && printf '{answer}' \"$(hostname)\" > /www/api/jobs/probe"
        f" && exec httpd -f -p {DASHBOARD_PORT} -h /www",
        restartPolicy="Always",
        mounts=[{"name": "www", "mountPath": "/www"}],
        volumes=[{"name": "www", "emptyDir": {}}],
        ports=[{"containerPort": DASHBOARD_PORT}],
        readinessProbe={"tcpSocket": {"port": DASHBOARD_PORT}, "periodSeconds": 1},
    )
    # The same head on kwok's CPU node: a pod that only pretends to run.
    kwok_head = busybox_pod("kwok-head", namespace, "sleep 3600", restartPolicy="Always")
    kwok_head["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes.CPU_NODES[0]}
    cluster.apply(
        [
            head,
            kwok_head,
            _head_service("real-head-svc", namespace, "real-head"),
            _head_service("headless-head-svc", namespace, "real-head", headless=True),
            _head_service("kwok-head-svc", namespace, "kwok-head"),
        ]
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod/real-head",
        "pod/kwok-head",
        "-n",
        namespace,
        "--timeout=120s",
        timeout=130,
    )
    wait_for(
        lambda: (
            _endpoint_nodes(cluster, "real-head-svc", namespace) == {"real-node-0"}
            and _endpoint_nodes(cluster, "headless-head-svc", namespace) == {"real-node-0"}
            and _endpoint_nodes(cluster, "kwok-head-svc", namespace) == {nodes.CPU_NODES[0]}
        ),
        what="both Services' endpoints, each on its node",
    )

    # Through kube-proxy (a ClusterIP) and straight to the pod (headless, as KubeRay makes it).
    for service in ("real-head-svc", "headless-head-svc"):
        real = _job_through_proxy(cluster, service, namespace)
        assert real == {"job_id": "probe", "status": "SUCCEEDED", "served_by": "real-head"}, (service, real)

    fake = _job_through_proxy(cluster, "kwok-head-svc", namespace)
    assert fake["status"] == "RUNNING" and "fake dashboard" in fake["message"], fake
    assert get(cluster, "pod", "kwok-head", namespace)["spec"]["nodeName"] == nodes.CPU_NODES[0]

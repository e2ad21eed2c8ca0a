"""The cluster tier: one real cluster per test session (tests/support/cluster), the chart installed
with the real Helm, and `llmtrain operator` as a local process authenticated as the chart's
ServiceAccount, so the real RBAC authorizer and admission plugins judge every request it makes.

Tests use their own namespaces (`namespace` fixture), labelled for the restricted Pod Security
profile as production namespaces are. Only fixtures live here; the steps they and the tests take
are in tests/support/cluster/steps.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    CHART,
    PLATFORM_NAMESPACE,
    RELEASE,
    OperatorProcess,
    assert_no_rbac_refusals,
    assert_only_declared_calls,
    delete_jobs,
    helm,
    start_operator,
    wait_for,
)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    c = Cluster.up(directory)
    print(f"\ncluster up in {time.monotonic() - started:.1f} s ({directory})")
    try:
        yield c
    finally:
        Cluster.down(directory)


@pytest.fixture(scope="session")
def platform(cluster: Cluster) -> str:
    """`helm install` of charts/llmtrain (CRD, RBAC, ServiceAccount, Deployment); its namespace."""
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        PLATFORM_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout=120s",
    )
    return PLATFORM_NAMESPACE


@pytest.fixture(scope="session")
def operator(
    cluster: Cluster, platform: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    op = start_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        op.stop()
        assert_no_rbac_refusals(op)
        assert_only_declared_calls(cluster)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-[]')}-{digest}"
    name = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in name)[:63].strip("-")
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/warn": "restricted",
                    },
                    # Its jobs may reference any of its Secrets (the containment policy's default is
                    # none; tests/cluster/test_containment.py covers the list).
                    "annotations": {ALLOWED_SECRETS_ANNOTATION: "*"},
                },
            }
        ]
    )
    # ServiceAccount admission refuses pods until the controller-manager made the default account.
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        what=f"ServiceAccount default in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def jobs_deleted_first(cluster: Cluster, namespace: str) -> Iterator[None]:
    yield
    delete_jobs(cluster, namespace)


@pytest.fixture
def other_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    name = f"{namespace[:56].rstrip('-')}-other"
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
    yield name
    delete_jobs(cluster, name)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)

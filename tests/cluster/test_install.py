"""Install for real: Helm's install and upgrade, `kubectl apply --server-side -k`, the CRD as the
real API server serves it (CEL compiled within its cost budget, `kubectl explain`), and a
namespace-scoped install running a job on its Roles alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import audit
from tests.support.cluster.cluster import REPO_ROOT, Cluster
from tests.support.cluster.steps import (
    CHART,
    PLATFORM_NAMESPACE,
    RELEASE,
    OperatorProcess,
    apply_doc,
    assert_no_rbac_refusals,
    cpu_job,
    get,
    helm,
    items,
    start_operator,
    wait_for,
    wait_phase,
)

CRD = "llmtrainingjobs.llmtrain.dev"


def test_helm_install_creates_the_platform_under_restricted_pod_security(
    cluster: Cluster, platform: str
) -> None:
    ns = get(cluster, "namespace", platform)
    assert ns is not None
    crd = get(cluster, "crd", CRD)
    assert crd is not None
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established.get("Established") == "True" and established.get("NamesAccepted") == "True"
    deployment = get(cluster, "deployment", "llmtrain-operator", platform)
    assert deployment is not None
    # The real scheduler placed the operator's pod on a fake node and kwok made it Ready; the
    # PodSecurity admission plugin let it in under the namespace's restricted level.
    cluster.kubectl(
        "label", "namespace", platform, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    wait_for(
        lambda: (
            (get(cluster, "deployment", "llmtrain-operator", platform) or {})
            .get("status", {})
            .get("readyReplicas")
            == 1
        ),
        what="the operator Deployment ready",
    )
    pods = items(cluster, "pods", platform, "app.kubernetes.io/name=llmtrain")
    assert pods and pods[0]["spec"]["nodeName"], pods
    warnings = cluster.kubectl(
        "label", "namespace", platform, "pod-security.kubernetes.io/warn=restricted", "--overwrite"
    ).stderr
    assert "violate" not in warnings, warnings


def _upgrade(cluster: Cluster, namespace: str, value: str) -> None:
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "--reuse-values",
        "--set",
        value,
        "--wait",
        "--timeout=120s",
    )


def test_helm_upgrade_with_changed_values_rolls_the_operator(cluster: Cluster, platform: str) -> None:
    before = get(cluster, "deployment", "llmtrain-operator", platform)
    assert before is not None
    _upgrade(cluster, platform, "logLevel=debug")
    after = get(cluster, "deployment", "llmtrain-operator", platform)
    assert after is not None
    args = after["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-level") + 1] == "debug", args
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    history = json.loads(helm(cluster, "history", RELEASE, "-n", platform, "-o", "json").stdout)
    assert [h["status"] for h in history][-1] == "deployed" and len(history) >= 2
    _upgrade(cluster, platform, "logLevel=info")


def test_kubectl_apply_server_side_kustomize(cluster: Cluster, tmp_path: Path) -> None:
    """manifests/ as a GitOps repository would use it: an overlay with its own namespace and prefix."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(REPO_ROOT / "manifests", overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources:\n- {base}\nnamespace: llmtrain-kustomize\nnamePrefix: kz-\n"
    )
    out = cluster.kubectl("apply", "--server-side", "--field-manager=gitops", "-k", str(overlay), timeout=120)
    assert "kz-llmtrain-operator" in out.stdout
    try:
        wait_for(
            lambda: (
                (get(cluster, "deployment", "kz-llmtrain-operator", "llmtrain-kustomize") or {})
                .get("status", {})
                .get("readyReplicas")
                == 1
            ),
            what="the kustomize-installed operator Deployment ready",
        )
        binding = get(cluster, "clusterrolebinding", "kz-llmtrain-operator")
        assert binding is not None
        assert binding["subjects"][0] == {
            "kind": "ServiceAccount",
            "name": "kz-llmtrain-operator",
            "namespace": "llmtrain-kustomize",
        }
        # A second apply is a no-op: the server-side field owners are stable (no GitOps drift).
        again = cluster.kubectl("apply", "--server-side", "--field-manager=gitops", "-k", str(overlay))
        assert "serverside-applied" in again.stdout
        assert "configured" not in again.stdout
    finally:
        # The CRD is shared with the Helm release: keep it, delete the rest.
        rendered = cluster.kubectl("kustomize", str(overlay)).stdout
        docs = [d for d in rendered.split("\n---\n") if "kind: CustomResourceDefinition" not in d]
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input="\n---\n".join(docs))


def test_crd_is_served_with_compiled_validation_and_explain(cluster: Cluster, platform: str) -> None:
    crd = get(cluster, "crd", CRD)
    assert crd is not None
    # A CEL rule over its cost budget or that fails to compile makes the API server refuse the CRD:
    # getting it back established means every rule compiled within budget.
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    explained = cluster.kubectl("explain", "llmtj.spec").stdout
    for field in ("model", "dataset", "strategy", "resources", "storage", "runPolicy"):
        assert field in explained, explained
    nested = cluster.kubectl("explain", "llmtj.spec.resources.gpusPerWorker").stdout
    assert "FIELD: gpusPerWorker" in nested and "integer" in nested, nested
    short = cluster.kubectl("api-resources", "--api-group=llmtrain.dev", "-o", "wide").stdout
    assert "llmtj" in short, short


def test_operator_runs_with_the_chart_service_account_only(cluster: Cluster, platform: str) -> None:
    """The identity the local operator process uses holds exactly the chart's rights."""
    sa = f"system:serviceaccount:{PLATFORM_NAMESPACE}:llmtrain-operator"
    can = cluster.kubectl(
        "auth", "can-i", "create", "rayjobs.ray.io", "-n", "default", f"--as={sa}", check=False
    )
    assert can.stdout.strip() == "yes", can
    cannot = cluster.kubectl("auth", "can-i", "delete", "nodes", f"--as={sa}", check=False)
    assert cannot.stdout.strip() == "no", cannot
    secrets = cluster.kubectl("auth", "can-i", "get", "secrets", "-n", "default", f"--as={sa}", check=False)
    assert secrets.stdout.strip() == "no", secrets


# Helm's longest release name (53 characters), with dots, which Helm allows and DNS labels do not.
LONGEST_RELEASE = "ml.platform.training.operator.production.europe.west4"


def test_the_longest_release_name_installs_every_named_object(
    cluster: Cluster, platform: str, namespace: str
) -> None:
    """The API server, not kubernetes-validate, checks names: a 64-character Service name or a dot in
    one is refused here. Every object with a name of its own, installed from the longest name."""
    assert len(LONGEST_RELEASE) == 53
    values = {
        "rbac.userRoles.create": "false",  # cluster-scoped with fixed names: the platform release has them
        "replicaCount": "2",  # the PodDisruptionBudget
        "grafanaDashboard.enabled": "true",
        "networkPolicy.enabled": "true",
    }
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    helm(cluster, "install", LONGEST_RELEASE, str(CHART), "-n", namespace, "--skip-crds", *sets)
    try:
        manifest = helm(cluster, "get", "manifest", LONGEST_RELEASE, "-n", namespace).stdout
        kinds: dict[str, set[str]] = {}
        for obj in yaml.safe_load_all(manifest):
            if obj:
                kinds.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
        expected = {"Deployment", "ServiceAccount", "Service", "ConfigMap", "NetworkPolicy"}
        expected |= {"PodDisruptionBudget", "ClusterRole", "ClusterRoleBinding"}
        assert expected <= set(kinds), kinds
        for kind, names in kinds.items():
            for name in names:
                assert len(name) <= 63 and "." not in name, (kind, name)
                scope = (
                    []
                    if kind.startswith("Cluster") or kind.startswith("ValidatingAdmission")
                    else [namespace]
                )
                assert get(cluster, kind.lower(), name, *scope) is not None, (kind, name)
        (service,) = kinds["Service"]
        assert len(service) == 63, service
    finally:
        helm(cluster, "uninstall", LONGEST_RELEASE, "-n", namespace, "--wait", check=False)


def test_the_documented_crd_upgrade_takes_over_helms_fields(
    cluster: Cluster, platform: str, tmp_path: Path
) -> None:
    """charts/llmtrain/README.md: `kubectl apply --server-side --force-conflicts -f crds/` after a
    chart upgrade. Without --force-conflicts, a changed field Helm's install set is a conflict."""
    original = CHART / "crds" / "llmtrain.dev_llmtrainingjobs.yaml"
    newer = tmp_path / "crds"
    newer.mkdir()
    label = "app.kubernetes.io/part-of: llmtrain\n"
    assert label in original.read_text()
    (newer / original.name).write_text(
        original.read_text().replace(label, "app.kubernetes.io/part-of: llmtrain-next\n", 1)
    )
    try:
        refused = cluster.kubectl("apply", "--server-side", "-f", str(newer), check=False)
        assert refused.returncode != 0 and "conflict" in refused.stderr.lower(), refused
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(newer))
        crd = get(cluster, "crd", CRD)
        assert crd is not None and crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llmtrain-next"
    finally:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(original))
    crd = get(cluster, "crd", CRD)
    assert crd is not None and crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llmtrain"


# The flags start_operator sets itself (local ports, plain logs); the rest come from the Deployment.
_LOCAL_FLAGS = ("--liveness-port", "--metrics-port", "--log-format", "--log-level")


def _deployment_args(deployment: dict[str, Any]) -> tuple[str, ...]:
    """The operator's flags as the chart's Deployment passes them, less those start_operator sets."""
    args = list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args[0] == "operator", args
    kept: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg in _LOCAL_FLAGS:
            next(rest)  # its value
        else:
            kept.append(arg)
    return tuple(kept)


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_namespace_scoped_install_runs_a_job_on_roles_alone(
    cluster: Cluster,
    platform: str,
    operator: OperatorProcess,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
) -> None:
    """watchNamespaces=[ns]: a second release in the platform namespace whose ServiceAccount gets
    Roles in ns only (and its leader-election Lease at home). The operator run as it, with its
    Deployment's flags, takes a job to its RayJob with no RBAC refusal in the API server's audit
    log, and may do nothing in another namespace or across namespaces."""
    release = "scoped"
    helm(
        cluster,
        "install",
        release,
        str(CHART),
        "-n",
        platform,
        "--skip-crds",
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--set",
        "rbac.userRoles.create=false",  # cluster-scoped with fixed names: the platform release has them
    )
    operator.stop()  # the session's all-namespace operator would take the job too
    scoped: OperatorProcess | None = None
    try:
        manifest = [
            o
            for o in yaml.safe_load_all(helm(cluster, "get", "manifest", release, "-n", platform).stdout)
            if o
        ]
        kinds = {o["kind"] for o in manifest}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, kinds
        (account,) = [o["metadata"]["name"] for o in manifest if o["kind"] == "ServiceAccount"]
        user = f"system:serviceaccount:{platform}:{account}"
        for verb, resource, where, allowed in (
            ("create", "rayjobs.ray.io", ["-n", namespace], "yes"),
            ("patch", "llmtrainingjobs.llmtrain.dev", ["-n", namespace, "--subresource=status"], "yes"),
            ("create", "rayjobs.ray.io", ["-n", other_namespace], "no"),
            ("patch", "configmaps", ["-n", other_namespace], "no"),
            ("list", "llmtrainingjobs.llmtrain.dev", ["--all-namespaces"], "no"),
            ("create", "roles.rbac.authorization.k8s.io", ["-n", other_namespace], "no"),
        ):
            can = cluster.kubectl("auth", "can-i", verb, resource, *where, f"--as={user}", check=False)
            assert can.stdout.strip() == allowed, (verb, resource, where, can.stdout, can.stderr)

        deployment = get(cluster, "deployment", f"{release}-llmtrain-operator", platform)
        assert deployment is not None
        since = audit.size(cluster.audit_log)
        scoped = start_operator(
            cluster,
            tmp_path,
            "scoped",
            args=_deployment_args(deployment),
            service_account=(account, platform),
        )
        apply_doc(cluster, cpu_job("scoped", namespace))
        apply_doc(cluster, cpu_job("elsewhere", other_namespace, suspend=True))
        status = wait_phase(cluster, namespace, "scoped", "Running", timeout=120)
        assert status["rayJobName"] == "scoped"
        assert get(cluster, "rayjob", "elsewhere", other_namespace) is None
        assert not (get(cluster, "llmtj", "elsewhere", other_namespace) or {}).get("status")
        assert "leading as" in scoped.output(), scoped.output()[-2000:]

        made = audit.calls(cluster.audit_log, user, since)
        assert made, "no calls of the scoped operator in the audit log"
        refused = [c for c in made if not c.authorized]
        assert not refused, refused[:10]
        # Nothing cluster-wide (namespace ""), nothing in another namespace; at home only its Lease.
        assert {c.namespace for c in made} == {namespace, platform}, sorted({c.namespace for c in made})
        assert {c.resource for c in made if c.namespace == platform} == {"leases"}, made
    finally:
        if scoped is not None:
            scoped.stop()
            assert_no_rbac_refusals(scoped)
        helm(cluster, "uninstall", release, "-n", platform, "--wait", check=False)
        operator.start()

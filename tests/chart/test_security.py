"""Restricted Pod Security on every pod and container, and least-privilege RBAC, for every value set."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.chart.helm import ALL_SETS, Obj, load_values, operator_deployment, pod_specs, render, render_set
from tests.chart.security import restricted_violations

RBAC_KINDS = {"Role", "ClusterRole"}


def _values(value_set: str) -> dict[str, Any]:
    return {} if value_set == "default" else load_values(value_set)


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_every_pod_and_container_is_restricted(value_set: str) -> None:
    pods = list(pod_specs(render_set(value_set)))
    assert pods, "the chart must render the operator pod"
    for owner, pod in pods:
        assert restricted_violations(pod) == [], f"{owner['kind']}/{owner['metadata']['name']}"


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_operator_container_is_probed_on_the_kopf_liveness_endpoint(value_set: str) -> None:
    for _, pod in pod_specs(render_set(value_set)):
        for container in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            for probe in ("startupProbe", "livenessProbe"):
                get = container[probe]["httpGet"]
                assert get["path"] == "/healthz"
                assert ports[get["port"]] == int(
                    container["args"][container["args"].index("--liveness-port") + 1]
                )


def test_the_security_check_catches_weakened_pods() -> None:
    """The checker above must flag each weakening; otherwise the tests prove nothing."""
    (_, pod), *_ = pod_specs(render_set("default"))
    weakenings: list[tuple[str, Any]] = [
        ("securityContext.runAsNonRoot", False),
        ("securityContext.seccompProfile", {"type": "Unconfined"}),
        ("hostNetwork", True),
        ("containers.0.securityContext.allowPrivilegeEscalation", True),
        ("containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}),
        ("containers.0.securityContext.readOnlyRootFilesystem", False),
        ("containers.0.securityContext.privileged", True),
        ("containers.0.resources", {"requests": {"cpu": "1", "memory": "1Gi"}}),
        ("volumes", [{"name": "host", "hostPath": {"path": "/"}}]),
        ("securityContext.seccompProfile", {"type": "Localhost"}),
        ("securityContext.seLinuxOptions", {"type": "spc_t"}),
        ("securityContext.seLinuxOptions", {"user": "system_u"}),
        ("securityContext.appArmorProfile", {"type": "Unconfined"}),
        ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
        ("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}),
        ("containers.0.securityContext.seLinuxOptions", {"type": "unconfined_t"}),
        ("containers.0.securityContext.seccompProfile", {"type": "RuntimeDefault", "localhostProfile": "x"}),
        ("containers.0.securityContext.procMount", "Unmasked"),
        ("containers.0.securityContext.runAsUser", 0),
    ]
    for path, value in weakenings:
        broken = _copy_with(pod, path.split("."), value)
        assert restricted_violations(broken), path


def _copy_with(obj: Any, path: list[str], value: Any) -> Any:
    out = copy.deepcopy(obj)
    target = out
    for key in path[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[path[-1]] = value
    return out


def rbac_rules(objects: tuple[Obj, ...] | list[Obj]) -> list[tuple[Obj, Obj]]:
    return [(o, rule) for o in objects if o["kind"] in RBAC_KINDS for rule in o.get("rules", [])]


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_rbac_has_no_wildcards(value_set: str) -> None:
    for role, rule in rbac_rules(render_set(value_set)):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            for item in rule.get(field, []):
                assert "*" not in item, f"{role['kind']}/{role['metadata']['name']}: {field} has {item!r}"
    for role in render_set(value_set):
        assert "aggregationRule" not in role, "an aggregated role can grow beyond what the chart states"


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_secrets_are_readable_only_when_enabled(value_set: str) -> None:
    enabled = bool(_values(value_set).get("rbac", {}).get("readSecrets"))
    secret_rules = [
        (role, rule)
        for role, rule in rbac_rules(render_set(value_set))
        if "" in rule["apiGroups"] and "secrets" in rule["resources"]
    ]
    if not enabled:
        assert secret_rules == []
        return
    assert secret_rules, "rbac.readSecrets is on but no rule grants it"
    for role, rule in secret_rules:
        assert role["metadata"]["name"].endswith("-operator"), "only the operator may read Secrets"
        assert rule == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}


def test_secret_rule_appears_in_every_namespaced_role() -> None:
    objects = render({"watchNamespaces": ["a", "b", "c"], "rbac": {"readSecrets": True}})
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator")]
    assert {r["metadata"]["namespace"] for r in roles} == {"a", "b", "c"}
    for role in roles:
        assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in role["rules"]


def test_service_account_token_is_mounted_only_where_needed() -> None:
    objects = render_set("default")
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False


def test_allowed_profiles_and_an_assigned_uid_render_as_given() -> None:
    """What restricted still allows passes the schema and reaches the pod unchanged."""
    values = load_values("security-profiles")
    pod = operator_deployment(render_set("security-profiles"))["spec"]["template"]["spec"]
    pod_sc = pod["securityContext"]
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod_sc)  # OpenShift assigns them
    assert pod_sc["runAsNonRoot"] is True
    for field in ("seccompProfile", "seLinuxOptions", "appArmorProfile"):
        assert pod_sc[field] == values["podSecurityContext"][field]
    container_sc = pod["containers"][0]["securityContext"]
    assert container_sc["appArmorProfile"] == values["securityContext"]["appArmorProfile"]
    assert restricted_violations(pod) == []

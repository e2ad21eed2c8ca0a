"""Every name the chart generates is a DNS label of at most 63 characters, for any release name
Helm accepts and any nameOverride/fullnameOverride the schema accepts.

kubernetes-validate checks no name format or length, and `helm template` does not either: the API
server is the first to refuse a 64-character Service name. So the names are checked here, on
renderings with every named object switched on.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest

from tests.chart.helm import Obj, chart, find, operator_deployment, render

# Helm's own rule for release names (helm.sh/helm/v3 pkg/chartutil/validate_name.go): at most 53
# characters, DNS-1123 labels joined by dots.
HELM_RELEASE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HELM_MAX_RELEASE_NAME = 53
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # Service names
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}

# The longest release names Helm allows, shaped to hit each truncation: plain, containing the
# chart name (used alone as the prefix), with dots, and with a dash where a truncation cuts.
RELEASES = {
    "longest": "ml-platform-training-operator-production-europe-west4",
    "contains-chart-name": "llmtrain-ml-platform-production-europe-west4-cluster",
    "dotted": "ml.platform.training.operator.production.europe.west4",
    "dash-at-cut": "a" * 45 + "-bbbbbbb",
    "single-char": "x",
}
# Every object that has a name of its own: ServiceMonitor, dashboard ConfigMap, NetworkPolicy,
# PodDisruptionBudget (two replicas), and the RBAC of both scopes.
EVERYTHING: dict[str, Any] = {
    "replicaCount": 2,
    "metrics": {"serviceMonitor": {"enabled": True}},
    "grafanaDashboard": {"enabled": True},
    "networkPolicy": {"enabled": True},
}
SCOPES: dict[str, dict[str, Any]] = {"cluster": {}, "namespaced": {"watchNamespaces": ["team-a", "team-b"]}}
OVERRIDES: dict[str, dict[str, Any]] = {
    "none": {},
    "nameOverride": {"nameOverride": "n" * 63},
    "fullnameOverride": {"fullnameOverride": "f" + "-x" * 31},  # 63 characters, a dash at each cut
}


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part)
    return out


def name_problems(objects: list[Obj]) -> list[str]:
    problems: list[str] = []
    for obj in objects:
        name = obj["metadata"]["name"]
        where = f"{obj['kind']}/{name}"
        pattern = DNS1035_LABEL if obj["kind"] == "Service" else DNS1123_LABEL
        if len(name) > 63 or not pattern.match(name):
            problems.append(f"{where}: {len(name)} characters, not a DNS label")
        for key, value in obj["metadata"].get("labels", {}).items():
            if len(value) > 63 or not LABEL_VALUE.match(value):
                problems.append(f"{where}: label {key}={value!r} is not a label value")
    return problems


def test_the_release_names_are_ones_helm_accepts() -> None:
    for release in RELEASES.values():
        assert len(release) <= HELM_MAX_RELEASE_NAME and HELM_RELEASE_NAME.match(release), release
    assert max(len(r) for r in RELEASES.values()) == HELM_MAX_RELEASE_NAME


@pytest.mark.parametrize("override", OVERRIDES)
@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("release", RELEASES)
def test_every_name_is_a_dns_label(release: str, scope: str, override: str) -> None:
    values = _merge(EVERYTHING, SCOPES[scope], OVERRIDES[override])
    chart().validate_schema(values)
    objects = render(values, release=RELEASES[release])
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ServiceAccount", "Service", "ServiceMonitor", "ConfigMap"} <= kinds
    assert {"NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert ({"Role", "RoleBinding"} if scope == "namespaced" else {"ClusterRoleBinding"}) <= kinds
    assert name_problems(objects) == []
    # Truncation never makes two objects of one kind share a name.
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), keys


@pytest.mark.parametrize("release", RELEASES)
def test_truncated_names_still_refer_to_each_other(release: str) -> None:
    objects = render(EVERYTHING, release=RELEASES[release])
    account = find(objects, "ServiceAccount")[0]["metadata"]["name"]
    pod = operator_deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    for binding in find(objects, "ClusterRoleBinding"):
        if binding["roleRef"]["name"].startswith("llmtrain-"):
            continue  # the fixed user roles
        assert find(objects, "ClusterRole", binding["roleRef"]["name"]), binding["roleRef"]
        assert binding["subjects"][0]["name"] == account


def test_the_checks_catch_what_the_api_server_refuses() -> None:
    """The check itself: a 64-character name, a dotted Service name and a long label value fail."""
    service = {"kind": "Service", "metadata": {"name": "a" * 64}}
    dotted = {"kind": "Service", "metadata": {"name": "a.b-operator-metrics"}}
    digit = {"kind": "Service", "metadata": {"name": "1a-operator-metrics"}}
    label = {"kind": "ConfigMap", "metadata": {"name": "a", "labels": {"k": "v" * 64}}}
    for obj in (service, dotted, digit, label):
        assert name_problems([obj]), obj


def test_default_names_are_unchanged_by_the_truncation() -> None:
    objects = render(EVERYTHING)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Service", "llmtrain-operator-metrics") in names
    assert ("ConfigMap", "llmtrain-dashboard") in names
    assert ("Deployment", "llmtrain-operator") in names


def test_longest_release_name_truncates_the_metrics_service_name() -> None:
    objects = render({}, release=RELEASES["longest"])
    (service,) = find(objects, "Service")
    assert service["metadata"]["name"] == "ml-platform-training-operator-production-europ-operator-metrics"
    assert len(service["metadata"]["name"]) == 63


def test_a_release_name_starting_with_a_digit_needs_a_fullname_override() -> None:
    """Helm accepts `1train`, the API server refuses a Service named `1train-...`: fail up front."""
    with pytest.raises(helm_python.HelmRenderError, match="set fullnameOverride"):
        render({}, release="1train")
    objects = render({"fullnameOverride": "train-one"}, release="1train")
    assert name_problems(objects) == []


@pytest.mark.parametrize(
    "values",
    [
        {"fullnameOverride": "f" * 64},
        {"fullnameOverride": "ml.train"},
        {"fullnameOverride": "1train"},
        {"fullnameOverride": "ML-train"},
        {"nameOverride": "n" * 64},
        {"nameOverride": "llm_train"},
    ],
    ids=lambda v: f"{next(iter(v))}={next(iter(v.values()))[:8]}",
)
def test_name_overrides_are_bounded_by_the_schema(values: dict[str, Any]) -> None:
    key = next(iter(values))
    with pytest.raises(helm_python.HelmValuesError, match=f"at '/{key}'"):
        chart().validate_schema(values)

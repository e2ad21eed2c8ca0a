"""The chart renders, lints clean and produces valid Kubernetes objects for every value set."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from llmtrain.constants import (
    API_GROUP,
    DEFAULT_TRAINER_IMAGE,
    KUBERAY_VERSION,
    OPERATOR_IMAGE_REPOSITORY,
    RAY_VERSION,
    VERSION,
)

from tests.chart.helm import (
    ALL_SETS,
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    Obj,
    find,
    load_values,
    notes,
    one,
    operator_container,
    operator_deployment,
    render,
    render_set,
    render_templates,
)

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "Namespace",
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}

# monitoring.coreos.com/v1 ServiceMonitor is a CRD type, absent from kubernetes-validate's schemas.
# This checks the fields the chart writes against the Prometheus Operator's API (v0.80+) and, with
# additionalProperties false, catches misspelt fields, which is what a CRD's structural schema does.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string", "minLength": 1},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {
                                "type": "string",
                                "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                            "scrapeTimeout": {
                                "type": "string",
                                "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_lint_reports_no_errors_or_warnings(value_set: str) -> None:
    values = None if value_set == "default" else load_values(value_set)
    report = helm_python.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("value_set", ALL_SETS)
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_against_kubernetes_schemas(value_set: str, kube_version: str) -> None:
    objects = render_set(value_set)
    assert objects
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
            continue
        kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_objects_are_namespaced_explicitly_and_unique(value_set: str) -> None:
    """`kubectl apply -k` of a rendering must not depend on the current namespace."""
    objects = render_set(value_set)
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), keys
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, obj["kind"]
        else:
            assert meta.get("namespace"), f"{obj['kind']}/{meta['name']} has no metadata.namespace"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "llmtrain"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_default_rendering() -> None:
    objects = render_set("default")
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    deployment = operator_deployment(objects)
    assert deployment["metadata"]["name"] == "llmtrain-operator"
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llmtrain-operator"
    assert pod["automountServiceAccountToken"] is True
    container = operator_container(objects)
    assert container["image"] == f"{OPERATOR_IMAGE_REPOSITORY}:{VERSION}"
    assert container["command"] == ["llmtrain"]
    assert container["args"] == [
        "operator",
        "--all-namespaces",
        "--liveness-port",
        "8080",
        "--metrics-port",
        "9090",
        "--log-level",
        "info",
        "--log-format",
        "json",
        "--trainer-image",
        DEFAULT_TRAINER_IMAGE,
        "--trainer-ray-version",
        RAY_VERSION,
        "--leader-elect",
        "--leader-election-name",
        "llmtrain-operator",
        "--leader-election-namespace",
        NAMESPACE,
        "--lease-seconds",
        "15",
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"liveness": 8080, "metrics": 9090}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert "readinessProbe" not in container
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    (election,) = (o for o in objects if o["kind"] == "Role")
    assert election["metadata"]["name"] == "llmtrain-operator-leader-election"
    for absent in ("ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"):
        assert not find(objects, absent)


def test_default_image_tags_follow_app_version() -> None:
    with helm_python.Chart.load(CHART) as chart:
        app_version = chart.metadata["appVersion"]
    container = operator_container(render_set("default"))
    assert container["image"].endswith(f":{app_version}")
    assert container["args"][container["args"].index("--trainer-image") + 1].endswith(f":{app_version}")


def test_metrics_service_selects_only_operator_pods() -> None:
    objects = render_set("default")
    service = one(objects, "Service")
    assert service["metadata"]["name"] == "llmtrain-operator-metrics"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = operator_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector.items() <= pod_labels.items()
    # Training pods carry app.kubernetes.io/name=llmtrain too; the component keeps them out.
    assert selector["app.kubernetes.io/component"] == "operator"
    assert operator_deployment(objects)["spec"]["selector"]["matchLabels"] == selector


def test_namespaced_install_passes_namespace_flags() -> None:
    args = operator_container(render_set("namespaced-rbac"))["args"]
    assert "--all-namespaces" not in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["team-a", "team-b"]


def test_custom_images() -> None:
    objects = render_set("custom-images")
    values = load_values("custom-images")
    container = operator_container(objects)
    # A digest pins the image; the tag (kept in values for readability) is not part of it.
    assert container["image"] == f"{values['image']['repository']}@{values['image']['digest']}"
    assert container["imagePullPolicy"] == "Always"
    trainer = container["args"][container["args"].index("--trainer-image") + 1]
    assert trainer == "registry.example.com/mirror/llmtrain/trainer:0.2.0-rc.1-cuda12"
    pod = operator_deployment(objects)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({}, "{repository}:" + VERSION),
        ({"tag": "0.2.0"}, "{repository}:0.2.0"),
        ({"digest": DIGEST}, "{repository}@" + DIGEST),
        ({"tag": "0.2.0", "digest": DIGEST}, "{repository}@" + DIGEST),
    ],
    ids=["default", "tag", "digest", "digest-over-tag"],
)
def test_a_digest_pins_both_images(image: dict[str, str], expected: str) -> None:
    container = operator_container(render({"image": image, "trainerImage": image}))
    assert container["image"] == expected.format(repository=OPERATOR_IMAGE_REPOSITORY)
    trainer = container["args"][container["args"].index("--trainer-image") + 1]
    assert trainer == expected.format(repository=DEFAULT_TRAINER_IMAGE.rsplit(":", 1)[0])


def test_resources_and_probe_timings() -> None:
    objects = render_set("resources")
    values = load_values("resources")
    container = operator_container(objects)
    assert container["resources"] == values["resources"]
    assert container["livenessProbe"]["periodSeconds"] == 30
    assert container["startupProbe"]["failureThreshold"] == 60
    pod = operator_deployment(objects)["spec"]["template"]["spec"]
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "256Mi"
    assert pod["terminationGracePeriodSeconds"] == 120


def test_partial_resource_override_keeps_other_defaults() -> None:
    container = operator_container(render({"resources": {"limits": {"cpu": "2"}}}))
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "512Mi"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


@pytest.mark.parametrize(("replicas", "has_pdb"), [(0, False), (1, False), (2, True), (3, True)])
def test_pod_disruption_budget_only_above_one_replica(replicas: int, has_pdb: bool) -> None:
    objects = render({"replicaCount": replicas})
    assert operator_deployment(objects)["spec"]["replicas"] == replicas
    assert bool(find(objects, "PodDisruptionBudget")) is has_pdb


def test_pod_disruption_budget_selects_operator_pods() -> None:
    objects = render_set("replicas-2")
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == operator_deployment(objects)["spec"]["selector"]["matchLabels"]
    )
    assert not find(
        render({"replicaCount": 2, "podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget"
    )
    assert "2 operator replicas: the holder of the Lease" in notes({"replicaCount": 2})
    assert "operator replicas" not in notes()


def test_service_monitor() -> None:
    objects = render_set("servicemonitor")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "10s")
    assert endpoint["honorLabels"] is True
    assert service["spec"]["ports"][0]["port"] == 9191
    assert service["metadata"]["annotations"] == {"example.com/team": "ml-platform"}
    assert "--metrics-port" in (args := operator_container(objects)["args"])
    assert args[args.index("--metrics-port") + 1] == "9191"


def _ports(rule: Obj) -> set[tuple[Any, str]]:
    return {(p["port"], p["protocol"]) for p in rule.get("ports", [])}


def test_network_policy() -> None:
    objects = render_set("networkpolicy")
    policy = one(objects, "NetworkPolicy")
    spec = policy["spec"]
    assert (
        spec["podSelector"]["matchLabels"] == operator_deployment(objects)["spec"]["selector"]["matchLabels"]
    )
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert _ports(ingress) == {("metrics", "TCP")}
    assert ingress["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    dns, api, extra = spec["egress"]
    assert _ports(dns) == {(53, "UDP"), (53, "TCP")}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert _ports(api) == {(6443, "TCP")}
    assert api["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]
    assert _ports(extra) == {(4317, "TCP")}


def test_network_policy_defaults_allow_api_server_on_any_address() -> None:
    policy = one(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    api = policy["spec"]["egress"][1]
    assert "to" not in api
    assert _ports(api) == {(443, "TCP"), (6443, "TCP")}


def test_existing_service_account() -> None:
    objects = render_set("existing-serviceaccount")
    assert not find(objects, "ServiceAccount")
    assert not find(objects, "ClusterRole", "llmtrain-edit")
    pod = operator_deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-llmtrain-operator"
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "platform-llmtrain-operator", "namespace": NAMESPACE}
    ]


def test_everything_set_names_and_flags() -> None:
    objects = render_set("everything")
    assert {o["metadata"]["name"] for o in objects if o["kind"] != "ClusterRole"} == {
        "ml-train-operator",
        "ml-train-operator-metrics",
        "ml-train-operator-leader-election",
        "ml-train-dashboard",
        "ml-train-reporter",
    }
    container = operator_container(objects)
    args = container["args"]
    assert args[args.index("--log-level") + 1] == "debug"
    assert args[args.index("--log-format") + 1] == "plain"
    assert args[args.index("--liveness-port") + 1] == "8081"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["liveness"] == 8081
    assert container["env"] == [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}]
    template = operator_deployment(objects)["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/owner": "ml-platform"}
    assert template["metadata"]["labels"]["example.com/cost-center"] == "4711"
    assert template["spec"]["priorityClassName"] == "system-cluster-critical"
    assert template["spec"]["securityContext"]["runAsUser"] == 1001
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] == 1001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"
    # An empty metricsFrom admits every source on the metrics port, and nothing else.
    assert one(objects, "NetworkPolicy")["spec"]["ingress"][0]["from"] == []


def test_extra_args_are_appended_after_the_chart_flags() -> None:
    args = operator_container(render({"extraArgs": ["--verbose-kopf", "x"]}))["args"]
    assert args[-2:] == ["--verbose-kopf", "x"]
    assert args[0] == "operator"


def test_same_liveness_and_metrics_port_fails() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"livenessPort and metrics\.port must differ"):
        render({"livenessPort": 9090})


def test_kuberay_requirement() -> None:
    values = {"kuberay": {"requireCRDs": True}}
    with pytest.raises(
        helm_python.HelmRenderError,
        match=rf"does not serve ray\.io/v1 RayJob: install KubeRay v{re.escape(KUBERAY_VERSION)}",
    ):
        render(values)
    objects = render(values, api_versions=("ray.io/v1", "ray.io/v1/RayJob"))
    annotations = operator_deployment(objects)["metadata"]["annotations"]
    assert annotations[f"{API_GROUP}/kuberay-version"] == f"v{KUBERAY_VERSION}"


def test_notes_explain_how_to_run_and_watch_an_example() -> None:
    text = notes()
    assert "kubectl apply -n default -f examples/tiny-cpu.yaml" in text
    assert "kubectl get llmtj -n default -w" in text
    assert f"rollout status deployment/{RELEASE}-operator" in text
    # Without KubeRay's RayJob API the notes say how to install it, pinned to the supported release.
    assert f"--version {KUBERAY_VERSION}" in text
    with_kuberay = notes(api_versions=("ray.io/v1/RayJob",))
    assert "WARNING" not in with_kuberay
    assert "kubectl get llmtj -n team-a -w" in notes(load_values("namespaced-rbac"))


def test_render_with_minimum_kube_version() -> None:
    objects = render(kube_version="v1.30.0")
    assert json.dumps(objects) == json.dumps(list(render_set("default")))


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_value_sets_differ_from_default(value_set: str) -> None:
    """A value set that renders like the defaults tests nothing."""
    assert render_set(value_set) != render_set("default")


def test_enough_value_sets() -> None:
    assert len(VALUE_SETS) >= 8
    assert {
        "namespaced-rbac",
        "servicemonitor",
        "networkpolicy",
        "custom-images",
        "resources",
        "replicas-2",
    } <= set(VALUE_SETS)


def test_templates_render_through_helm_engine_not_python() -> None:
    """Guard: the rendering really is Helm's (Go templates, Sprig), with the chart's helpers."""
    rendered = render_templates()
    assert set(rendered) >= {f"llmtrain/templates/{t}" for t in ("deployment.yaml", "NOTES.txt")}
    assert "{{" not in "".join(rendered.values())


def test_trainer_pull_secrets_become_operator_flags() -> None:
    args = operator_container(render({"trainerImage": {"pullSecrets": ["registry", "mirror"]}}))["args"]
    flags = [args[i + 1] for i, a in enumerate(args) if a == "--image-pull-secret"]
    assert flags == ["registry", "mirror"]
    assert "--image-pull-secret" not in operator_container(render({}))["args"]


def test_the_default_images_ray_version_becomes_the_operator_flag() -> None:
    args = operator_container(render({"trainerImage": {"rayVersion": "2.61.1"}}))["args"]
    assert args[args.index("--trainer-ray-version") + 1] == "2.61.1"

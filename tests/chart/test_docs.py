"""The chart's README documents every value; its snippets agree with the CRD and the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from llmtrain.api.crd import CRD_FILENAME
from llmtrain.constants import API_GROUP, KUBERAY_VERSION, PLURAL

from tests.chart.helm import CHART, ROOT, one, render

README = (CHART / "README.md").read_text()
VALUES_TEXT = (CHART / "values.yaml").read_text()
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
CRD_PATH = ROOT / "manifests" / "crds" / CRD_FILENAME
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):")


def documented_keys(text: str) -> dict[str, bool]:
    """Every key path of values.yaml -> whether a `# --` comment (helm-docs style) documents it.

    A `# --` comment documents the key and everything below it; keys without one are groups
    whose children carry the comments.
    """
    keys: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if not match:
            if not stripped:
                comment = []
            continue  # list items and nested flow content
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), match["key"]])
        if not any(k.startswith("-") for _, k in stack):
            keys[path] = any(c.startswith("# --") for c in comment)
        stack.append((indent, match["key"]))
        comment = []
    return keys


def values_leaves(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in values_leaves(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def documented_paths() -> list[str]:
    keys = documented_keys(VALUES_TEXT)
    return [path for path, has_doc in keys.items() if has_doc]


def test_every_value_has_a_doc_comment() -> None:
    documented = documented_paths()
    values = yaml.safe_load(VALUES_TEXT)
    for leaf in values_leaves(values):
        parts = leaf.split(".")
        ancestors = {".".join(parts[: i + 1]) for i in range(len(parts))}
        assert ancestors & set(documented), f"values.yaml: {leaf} has no `# --` comment on it or a parent"


def test_readme_documents_every_value() -> None:
    values_section = README.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([^`]+)` \|", values_section, flags=re.MULTILINE))
    documented = set(documented_paths())
    assert documented, "no `# --` comments found in values.yaml"
    assert documented - rows == set(), "values missing from the README table"
    values = yaml.safe_load(VALUES_TEXT)
    existing = set(documented_keys(VALUES_TEXT)) | set(values_leaves(values))
    assert rows - existing == set(), "README documents values that do not exist"


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    """Follow `allOf: [{$ref: #/definitions/x}]` wrappers to the definition's properties."""
    for sub in node.get("allOf", []):
        if "$ref" in sub:
            return {**SCHEMA["definitions"][sub["$ref"].rsplit("/", 1)[1]], **node}
    return node


def _schema_node(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SCHEMA
    for part in path.split("."):
        if node is None:
            return None
        node = _deref(node).get("properties", {}).get(part)
    return node


def test_every_documented_value_is_typed_and_described_in_the_schema() -> None:
    for path in documented_paths():
        node = _schema_node(path)
        assert node is not None, f"{path} is not in values.schema.json"
        assert node.get("description"), f"{path} has no description in values.schema.json"
        node = _deref(node)
        assert {"type", "enum", "const", "anyOf", "oneOf"} & set(node), (
            f"{path} has no type in values.schema.json"
        )


# Schema fields that are valid but deliberately unset in values.yaml (Kubernetes' own defaults apply).
OPTIONAL_IN_VALUES = {
    "global",
    "podSecurityContext.fsGroupChangePolicy",
    "podSecurityContext.supplementalGroups",
    "podSecurityContext.seLinuxOptions",
    "podSecurityContext.appArmorProfile",
    "podSecurityContext.seccompProfile.localhostProfile",
    "securityContext.runAsUser",
    "securityContext.runAsGroup",
    "securityContext.seLinuxOptions",
    "securityContext.appArmorProfile",
    "securityContext.capabilities.add",
    "securityContext.seccompProfile.localhostProfile",
}


def test_schema_has_no_keys_missing_from_values_yaml() -> None:
    """Every value the schema defines has a default in values.yaml, where it is documented."""

    def walk(node: dict[str, Any], vals: Any, prefix: str) -> None:
        for key, sub in _deref(node).get("properties", {}).items():
            path = f"{prefix}{key}"
            if path in OPTIONAL_IN_VALUES or sub.get("not") == {}:  # optional, or a forbidden key
                continue
            assert isinstance(vals, dict) and key in vals, (
                f"values.schema.json has {path}, values.yaml does not"
            )
            walk(sub, vals[key], f"{path}.")

    walk(SCHEMA, yaml.safe_load(VALUES_TEXT), "")


def test_readme_pins_the_kuberay_install_commands() -> None:
    assert f"--repo https://ray-project.github.io/kuberay-helm/ --version {KUBERAY_VERSION}" in README
    assert f"kuberay/kuberay-operator --version {KUBERAY_VERSION}" in README
    assert "kubectl get llmtj -w" in README


def _yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)]


def _crd_status_properties() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["status"]["properties"]
    return props


def _resolve(properties: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node: dict[str, Any] = {"properties": properties}
    for part in path:
        node = node["properties"][part]
    return node


def test_kube_state_metrics_snippet_matches_the_crd_and_the_dashboard() -> None:
    (ksm,) = [b for b in _yaml_blocks(README) if isinstance(b, dict) and "customResourceState" in b]
    config = ksm["customResourceState"]["config"]
    assert config["kind"] == "CustomResourceStateMetrics"
    (resource,) = config["spec"]["resources"]
    crd = yaml.safe_load(CRD_PATH.read_text())
    assert resource["groupVersionKind"] == {
        "group": crd["spec"]["group"],
        "version": crd["spec"]["versions"][0]["name"],
        "kind": crd["spec"]["names"]["kind"],
    }
    status = _crd_status_properties()
    exported = set()
    for metric in resource["metrics"]:
        each = metric["each"]
        path = (each.get("gauge") or each.get("stateSet"))["path"]
        assert path[0] == "status"
        leaf = _resolve(status, path[1:])  # KeyError when the field is not in the CRD
        if each["type"] == "Gauge":
            assert leaf["type"] in {"number", "integer"}
        else:
            assert set(each["stateSet"]["list"]) == set(leaf["enum"])
        exported.add(f"kube_customresource_{metric['name']}")
    assert {
        "kube_customresource_llmtrainingjob_loss",
        "kube_customresource_llmtrainingjob_tokens_per_second",
    } <= exported
    rules = {
        (g, r) for rule in ksm["rbac"]["extraRules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert (API_GROUP, PLURAL) in rules
    # The dashboard queries exactly the labels this configuration produces.
    dashboard = one(render({"grafanaDashboard": {"enabled": True}}), "ConfigMap")["data"]["llmtrain.json"]
    for label in resource["labelsFromPath"]:
        assert f"{{{{{label}}}}}" in dashboard or f"{label}=~" in dashboard


def test_readme_metric_names_are_the_contract() -> None:
    for metric in ("llmtrain_jobs", "llmtrain_reconcile_duration_seconds", "llmtrain_errors_total"):
        assert f"`{metric}`" in README


def test_docs_link_targets_exist() -> None:
    for target in ("docs/argocd.md", "tests/e2e/run.sh", "examples/tiny-cpu.yaml"):
        assert target in README
        assert (Path(ROOT) / target).exists(), target


def _cel_rules(node: Any) -> list[str]:
    """Every x-kubernetes-validations rule in a schema, depth first."""
    if isinstance(node, dict):
        own = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        return own + [rule for value in node.values() for rule in _cel_rules(value)]
    if isinstance(node, list):
        return [rule for value in node for rule in _cel_rules(value)]
    return []


def test_root_readme_says_where_reserved_hf_args_are_refused() -> None:
    """The API server's CEL cannot type the free-form trainer.huggingface.args, so the models
    (`llmtrain validate`, the operator) refuse the platform's keys: the README must not list that
    rule among the API server's, nor say the CRD refuses them, while the CRD has no such rule."""
    readme = " ".join((Path(ROOT) / "README.md").read_text().split())
    crd_rules = _cel_rules(yaml.safe_load(CRD_PATH.read_text()))
    cel_part = readme.split("Rules checked by the API server (CEL)")[1].split("what KubeRay or the kubelet")[
        0
    ]
    models_part = readme.split("`llmtrain validate` and the operator also refuse")[1].split(
        "The spec is immutable"
    )[0]
    if not any("huggingface.args" in rule for rule in crd_rules):
        assert "trainer.huggingface.args" not in cel_part, "the CRD has no CEL rule on huggingface.args"
        assert "refused by the CRD" not in readme
        assert "`trainer.huggingface.args` the platform owns" in models_part

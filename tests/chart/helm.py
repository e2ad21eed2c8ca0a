"""Render charts/llmtrain with Helm's real engine (helm-python-sdk, Helm v4 in-process).

The value sets under tests/chart/values/ are the configurations every chart test runs against.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

from hack.render_manifests import CHART_DIR, NAMESPACE, RELEASE, ROOT

__all__ = [
    "ALL_SETS",
    "BAD_VALUES_DIR",
    "CHART",
    "KUBE_VERSIONS",
    "NAMESPACE",
    "RELEASE",
    "ROOT",
    "VALUES_DIR",
    "VALUE_SETS",
    "Obj",
    "chart",
    "find",
    "load_values",
    "notes",
    "one",
    "operator_container",
    "operator_deployment",
    "pod_specs",
    "render",
    "render_set",
    "render_templates",
]

CHART = ROOT / CHART_DIR
VALUES_DIR = Path(__file__).parent / "values"
BAD_VALUES_DIR = Path(__file__).parent / "bad-values"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest with schemas.
KUBE_VERSIONS = ("1.30", "1.37")

Obj = dict[str, Any]


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render_templates(
    values: dict[str, Any] | None = None,
    *,
    api_versions: tuple[str, ...] = (),
    kube_version: str | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> dict[str, str]:
    """Template path -> rendered text, NOTES.txt included."""
    if not api_versions and kube_version is None:
        return chart().render(values or {}, name=release, namespace=namespace)
    # helm-python-sdk 0.2.2's Chart.render does not forward these two options, although the
    # library's helm_render accepts them (the --api-versions/--kube-version of `helm template`).
    opts: dict[str, Any] = {"name": release, "namespace": namespace, "api_versions": list(api_versions)}
    if kube_version is not None:
        opts["kube_version"] = kube_version
    rendered = _native.call_string("helm_render", chart()._raw(), json.dumps(values or {}), json.dumps(opts))
    result: dict[str, str] = json.loads(rendered)
    return result


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[Obj]:
    """Every object the chart renders (NOTES.txt excluded), in template order."""
    objects: list[Obj] = []
    for template, text in sorted(render_templates(values, **kwargs).items()):
        if template.endswith(".yaml"):
            objects.extend(d for d in yaml.safe_load_all(text) if d)
    return objects


def notes(values: dict[str, Any] | None = None, **kwargs: Any) -> str:
    rendered = render_templates(values, **kwargs)
    return next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))


def load_values(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((VALUES_DIR / f"{name}.yaml").read_text()) or {}
    return data


VALUE_SETS: tuple[str, ...] = tuple(sorted(p.stem for p in VALUES_DIR.glob("*.yaml")))


@functools.cache
def render_set(name: str) -> tuple[Obj, ...]:
    """The objects of a named value set ('default' = no overrides); cached, treat as read-only."""
    values = {} if name == "default" else load_values(name)
    return tuple(render(values))


ALL_SETS: tuple[str, ...] = ("default", *VALUE_SETS)


def find(objects: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(objects: tuple[Obj, ...] | list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner object, pod spec) for every object that carries a pod template or is a Pod."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield obj, obj["spec"]
        template = obj.get("spec", {}).get("template", {})
        if "spec" in template:
            yield obj, template["spec"]


def operator_deployment(objects: tuple[Obj, ...] | list[Obj]) -> Obj:
    return one(objects, "Deployment")


def operator_container(objects: tuple[Obj, ...] | list[Obj]) -> Obj:
    containers: list[Obj] = operator_deployment(objects)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "operator")

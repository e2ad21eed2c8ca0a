"""manifests/ is the chart's default rendering (drift test), and `kubectl apply -k manifests/` applies it.

kubectl's kustomize only transforms objects when the kustomization asks for it (namespace,
labels, patches...). The tests require a kustomization of plain `resources`, so what
`kubectl apply -k manifests/` sends is exactly the listed files' objects, which must equal the
chart's default rendering plus the CRD and the namespace.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from llmtrain.api.crd import CRD_FILENAME, crd_yaml
from llmtrain.api.validation import parse_job

from hack import render_manifests
from tests.chart.helm import CHART, NAMESPACE, ROOT, render_set

MANIFESTS = ROOT / "manifests"


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    return data


def applied_objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for resource in kustomization()["resources"]:
        objects.extend(d for d in yaml.safe_load_all((MANIFESTS / resource).read_text()) if d)
    return objects


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    return (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def test_manifests_are_up_to_date() -> None:
    """The drift test: `make manifests` would change nothing."""
    assert render_manifests.main(["--check"]) == 0, "manifests/ is stale: run `make manifests`"


def test_check_mode_detects_drift(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for part in ("charts", "examples", "manifests"):
        shutil.copytree(ROOT / part, root / part)
    assert render_manifests.main(["--check", "--root", str(root)]) == 0
    deployment = root / "manifests" / "platform" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("replicas: 1", "replicas: 2"))
    (root / "manifests" / "platform" / "extra.yaml").write_text("kind: ConfigMap\n")
    (root / "examples" / "tiny-cpu.yaml").write_text("# changed\n")
    assert render_manifests.main(["--check", "--root", str(root)]) == 1
    assert render_manifests.main(["--root", str(root)]) == 0
    assert not (root / "manifests" / "platform" / "extra.yaml").exists()
    assert render_manifests.main(["--check", "--root", str(root)]) == 0


def test_kustomization_has_no_transformers() -> None:
    data = kustomization()
    assert set(data) == {"apiVersion", "kind", "resources"}
    assert data["kind"] == "Kustomization"
    listed = {MANIFESTS / r for r in data["resources"]}
    assert all(p.is_file() for p in listed)
    on_disk = {
        p for p in MANIFESTS.rglob("*.yaml") if p.parent.name != "examples" and p.name != "kustomization.yaml"
    }
    assert listed == on_disk, "every manifest file must be applied, and only those"


def test_apply_k_content_equals_the_chart_rendering() -> None:
    objects = applied_objects()
    keys = [_key(o) for o in objects]
    assert len(keys) == len(set(keys)), "kustomize rejects duplicate objects"
    by_key = {_key(o): o for o in objects}
    chart_objects = list(render_set("default"))
    crd = yaml.safe_load((CHART / "crds" / CRD_FILENAME).read_text())
    expected = {_key(o): o for o in [*chart_objects, crd]}
    namespace = by_key.pop(("v1", "Namespace", "", NAMESPACE))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert by_key == expected


def test_every_namespaced_object_goes_to_the_manifest_namespace() -> None:
    for obj in applied_objects():
        namespace = obj["metadata"].get("namespace")
        assert namespace in (None, NAMESPACE), _key(obj)


def test_manifests_validate_against_kubernetes_schemas() -> None:
    for obj in applied_objects():
        kubernetes_validate.validate(obj, "1.30", strict=True)


def test_crd_copies_are_identical_and_generated() -> None:
    chart_crd = (CHART / "crds" / CRD_FILENAME).read_text()
    assert chart_crd == (MANIFESTS / "crds" / CRD_FILENAME).read_text()
    assert chart_crd == crd_yaml(), "the CRD is stale: run `make generate`"


def test_examples_are_copies() -> None:
    sources = sorted((ROOT / "examples").glob("*.yaml"))
    copies = sorted((MANIFESTS / "examples").glob("*.yaml"))
    assert [p.name for p in sources] == [p.name for p in copies]
    assert "tiny-cpu.yaml" in [p.name for p in copies]
    for source, copy in zip(sources, copies, strict=True):
        assert source.read_bytes() == copy.read_bytes(), copy.name


@pytest.mark.parametrize("path", sorted((MANIFESTS / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_are_valid_jobs(path: Path) -> None:
    parse_job(yaml.safe_load(path.read_text()))

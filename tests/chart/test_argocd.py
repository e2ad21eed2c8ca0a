"""The Argo CD health check (Lua) and the Flux CEL health checks in docs/argocd.md, executed.

The Lua runs under Lua 5.1 (lupa), the dialect of gopher-lua in Argo CD, the way Argo CD runs it:
the script body with the live object as the global `obj`, returning a table {status, message}.
The CEL runs under cel-python with the object's top-level fields as variables, in Flux's order.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import celpy
import celpy.adapter
import celpy.evaluation
import pytest
import yaml
from llmtrain.api.crd import CRD_FILENAME
from llmtrain.api.status import PHASES
from lupa import lua51

from tests.chart.helm import ALL_SETS, CHART, ROOT, find, render_set

DOC = (ROOT / "docs" / "argocd.md").read_text()
README = (CHART / "README.md").read_text()
HEALTH_KEY = "resource.customizations.health.llmtrain.dev_LLMTrainingJob"
IGNORE_KEY = "resource.customizations.ignoreResourceUpdates.llmtrain.dev_LLMTrainingJob"
ARGO_HEALTH = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def _yaml_blocks() -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)]


@functools.cache
def argocd_cm() -> dict[str, Any]:
    (cm,) = [
        b for b in _yaml_blocks() if isinstance(b, dict) and b.get("metadata", {}).get("name") == "argocd-cm"
    ]
    return cm


def job(phase: str | None = None, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "tiny-cpu", "namespace": "default", "generation": 1},
        "spec": {"storage": {"create": {"size": "1Gi"}}},
    }
    if phase is not None:
        obj["status"] = {"phase": phase, "observedGeneration": 1, **status}
    return obj


def argo_health(obj: dict[str, Any]) -> dict[str, str]:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    script = argocd_cm()["data"][HEALTH_KEY]
    # Argo CD's sandbox has no io/os; make sure the script does not need them.
    lua.execute("io = nil; os = nil")
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script)
    assert result is not None, "the script must return its table"
    out = {k: result[k] for k in ("status", "message") if result[k] is not None}
    assert set(dict(result.items())) <= {"status", "message"}
    return out


def test_configmap_keys() -> None:
    data = argocd_cm()["data"]
    assert set(data) == {HEALTH_KEY, IGNORE_KEY}
    assert argocd_cm()["metadata"]["namespace"] == "argocd"
    ignored = yaml.safe_load(data[IGNORE_KEY])["jsonPointers"]
    assert ignored == ["/status/progress", "/status/kopf"]


@pytest.mark.parametrize(
    ("phase", "health"),
    [
        ("Pending", "Progressing"),
        ("Initializing", "Progressing"),
        ("Running", "Progressing"),
        ("Succeeded", "Healthy"),
        ("Failed", "Degraded"),
        ("Suspended", "Suspended"),
    ],
)
def test_phase_maps_to_health(phase: str, health: str) -> None:
    assert argo_health(job(phase))["status"] == health


def test_every_api_phase_is_mapped() -> None:
    for phase in PHASES:
        assert argo_health(job(phase))["status"] in ARGO_HEALTH - {"Unknown"}, phase


def test_message_comes_from_status() -> None:
    result = argo_health(job("Failed", message="rank 3: CUDA out of memory"))
    assert result == {"status": "Degraded", "message": "rank 3: CUDA out of memory"}
    assert argo_health(job("Succeeded")) == {"status": "Healthy", "message": "Succeeded"}


def test_running_message_shows_progress() -> None:
    result = argo_health(job("Running", message="Training", progress={"summary": "40/120", "loss": 2.5}))
    assert result == {"status": "Progressing", "message": "Training (step 40/120)"}


def test_no_status_yet_is_progressing() -> None:
    result = argo_health(job())
    assert result["status"] == "Progressing"
    assert "operator" in result["message"]


def test_unobserved_edit_is_progressing() -> None:
    obj = job("Succeeded")
    obj["metadata"]["generation"] = 2
    result = argo_health(obj)
    assert result == {"status": "Progressing", "message": "Waiting for the operator to act on generation 2"}


def test_unknown_phase_is_unknown() -> None:
    assert argo_health(job("Exploded")) == {"status": "Unknown", "message": "Unknown phase Exploded"}


def test_status_without_observed_generation_still_maps() -> None:
    obj = job("Running")
    del obj["status"]["observedGeneration"]
    assert argo_health(obj)["status"] == "Progressing"


# --- Flux -------------------------------------------------------------------------------------


@functools.cache
def flux_check() -> dict[str, str]:
    (kustomization,) = [b for b in _yaml_blocks() if isinstance(b, dict) and b.get("kind") == "Kustomization"]
    (check,) = kustomization["spec"]["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("llmtrain.dev/v1alpha1", "LLMTrainingJob")
    return {k: v for k, v in check.items() if k in {"current", "failed", "inProgress"}}


def flux_status(obj: dict[str, Any]) -> str:
    """kustomize-controller's StatusEvaluator.Evaluate: generation check, then inProgress, failed, current."""
    observed = obj.get("status", {}).get("observedGeneration")
    if observed is not None and observed != obj["metadata"].get("generation"):
        return "InProgress"
    env = celpy.Environment()
    activation = {k: celpy.adapter.json_to_cel(copy.deepcopy(v)) for k, v in obj.items()}
    for key, result in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        expr = flux_check().get(key)
        if expr is None:
            continue
        try:
            value = env.program(env.compile(expr)).evaluate(activation)
        except celpy.evaluation.CELEvalError:
            return "Error"
        if value:
            return result
    return "InProgress"


@pytest.mark.parametrize(
    ("phase", "status"),
    [
        ("Pending", "InProgress"),
        ("Initializing", "InProgress"),
        ("Running", "InProgress"),
        ("Succeeded", "Current"),
        ("Failed", "Failed"),
        ("Suspended", "Current"),
    ],
)
def test_flux_health_check_expressions(phase: str, status: str) -> None:
    assert flux_status(job(phase)) == status


def test_flux_waits_while_there_is_no_status() -> None:
    """Documented behaviour: no status yet is an expression error, which Flux keeps retrying."""
    assert flux_status(job()) == "Error"


# --- The CRD's lifecycle under GitOps ------------------------------------------------------------


def _documents(kind: str) -> list[dict[str, Any]]:
    return [b for b in _yaml_blocks() if isinstance(b, dict) and b.get("kind") == kind]


def test_flux_helmrelease_installs_and_upgrades_the_crd() -> None:
    """Flux's upgrade default (`Skip`) would freeze the CRD at its first version."""
    (release,) = _documents("HelmRelease")
    assert release["apiVersion"] == "helm.toolkit.fluxcd.io/v2"
    spec = release["spec"]
    assert spec["install"]["crds"] == spec["upgrade"]["crds"] == "CreateReplace"
    # The chart it names is this one, and what CreateReplace applies is its crds/ directory.
    chart_path = ROOT / spec["chart"]["spec"]["chart"].removeprefix("./")
    assert chart_path == CHART
    assert (chart_path / "crds" / CRD_FILENAME).is_file()
    assert spec["chart"]["spec"]["sourceRef"]["kind"] == "GitRepository"
    assert spec["chart"]["spec"]["reconcileStrategy"] == "Revision"
    # After KubeRay: the dependency is the KubeRay release the Argo CD example installs.
    (kuberay,) = [a for a in _documents("Application") if a["metadata"]["name"] == "kuberay-operator"]
    assert spec["dependsOn"] == [
        {"name": "kuberay-operator", "namespace": kuberay["spec"]["destination"]["namespace"]}
    ]


def test_argocd_applications_apply_the_crd_server_side() -> None:
    apps = {a["metadata"]["name"]: a for a in _documents("Application")}
    assert set(apps) == {"kuberay-operator", "llmtrain"}
    for app in apps.values():
        assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    source = apps["llmtrain"]["spec"]["source"]
    assert (ROOT / source["path"] / "crds" / CRD_FILENAME).is_file()
    assert not source.get("helm", {}).get("skipCrds"), "the CRD must stay part of the Application"
    # The documented non-cascading delete names this Application.
    assert "argocd app delete llmtrain --cascade=false" in DOC


def test_the_crd_is_kept_when_a_gitops_app_is_deleted_or_prunes() -> None:
    """Deleting the CRD deletes every job with it. The shipped CRD (chart crds/ and manifests/)
    carries Helm's keep policy, which Argo CD honours, and Flux's prune opt-out; no template renders
    a CRD (Helm would delete it on uninstall)."""
    for path in (CHART / "crds" / CRD_FILENAME, ROOT / "manifests" / "crds" / CRD_FILENAME):
        annotations = yaml.safe_load(path.read_text())["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep", path
        assert annotations["kustomize.toolkit.fluxcd.io/prune"] == "disabled", path
    for value_set in ALL_SETS:
        assert not find(render_set(value_set), "CustomResourceDefinition"), "update README and docs/argocd.md"
    assert "The CRD ships in `crds/` only" in README
    assert "carries `helm.sh/resource-policy: keep`" in DOC


def test_documented_server_side_applies_force_conflicts() -> None:
    """A server-side apply over fields Helm set conflicts with the `helm` field manager."""
    commands = re.findall(r"kubectl apply --server-side[^\n`]*", README + DOC)
    assert commands
    for command in commands:
        assert "--force-conflicts" in command, command
    assert "kubectl apply --server-side --force-conflicts -f charts/llmtrain/crds/" in README
    assert (CHART / "crds" / CRD_FILENAME).is_file()
    # "under 128 KiB": a client-side apply's last-applied annotation (256 KiB at most) would fit,
    # with room to spare.
    size = (CHART / "crds" / CRD_FILENAME).stat().st_size
    assert size < 128 * 1024, size
    assert "LLMTrainingJob CRD (under 128 KiB)" in README


def test_the_chart_readme_and_the_argocd_guide_agree_on_when_the_crd_survives() -> None:
    """Both say the same: Argo CD 2.8 and newer keep the CRD through the keep annotation, and only an
    older one needs the non-cascading delete. Before, the chart README said every Argo CD deletes it."""
    for name, text in (("charts/llmtrain/README.md", README), ("docs/argocd.md", DOC)):
        flat = " ".join(text.split())
        assert "helm.sh/resource-policy: keep" in flat, name
        assert "Argo CD 2.8 and newer" in flat, name
        older = flat.index("--cascade=false")
        assert "older" in flat[older - 200 : older].lower(), (name, flat[older - 200 : older + 20])

"""The Grafana dashboard ConfigMap: valid JSON whose panels query the operator's metrics."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.chart.helm import NAMESPACE, one, render, render_set

OPERATOR_METRICS = ("llmtrain_jobs", "llmtrain_reconcile_duration_seconds_bucket", "llmtrain_errors_total")
TRAINING_METRICS = (
    "kube_customresource_llmtrainingjob_loss",
    "kube_customresource_llmtrainingjob_tokens_per_second",
)


def dashboard(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    configmap = one(render(values or {"grafanaDashboard": {"enabled": True}}), "ConfigMap")
    return configmap, json.loads(configmap["data"]["llmtrain.json"])


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dash) for t in p["targets"]]


def test_configmap_is_found_by_the_grafana_sidecar() -> None:
    configmap, _ = dashboard()
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    configmap, _ = dashboard(
        {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "grafana",
                "annotations": {"grafana_folder": "ML"},
            }
        }
    )
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert not [o for o in render_set("default") if o["kind"] == "ConfigMap"]


def test_dashboard_queries_every_metric() -> None:
    _, dash = dashboard()
    queries = "\n".join(exprs(dash))
    for metric in OPERATOR_METRICS + TRAINING_METRICS:
        assert re.search(rf"\b{metric}\b", queries), metric
    titles = {p["title"] for p in panels(dash)}
    assert {"Jobs by phase", "Reconcile latency", "Training loss", "Throughput (tokens/s)"} <= titles


def test_dashboard_structure() -> None:
    _, dash = dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "llmtrain-overview"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dash):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        for target in panel["targets"]:
            # Balanced brackets and braces: a cheap PromQL syntax guard.
            for open_, close in ("()", "{}", "[]"):
                assert target["expr"].count(open_) == target["expr"].count(close), target["expr"]
    # Training panels filter on the variables; operator panels must not (their series have no job labels).
    for panel in panels(dash):
        uses_vars = any("$job" in e for e in (t["expr"] for t in panel["targets"]))
        assert uses_vars == any(m in t["expr"] for t in panel["targets"] for m in TRAINING_METRICS), panel[
            "title"
        ]


def test_latency_panel_shows_quantiles_of_the_histogram() -> None:
    _, dash = dashboard()
    (latency,) = [p for p in panels(dash) if p["title"] == "Reconcile latency"]
    assert latency["fieldConfig"]["defaults"]["unit"] == "s"
    quantiles = [re.match(r"histogram_quantile\((0\.\d+),", t["expr"]) for t in latency["targets"]]
    assert [q.group(1) for q in quantiles if q] == ["0.5", "0.95", "0.99"]

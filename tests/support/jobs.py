"""Builders for LLMTrainingJob documents used across tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def minimal_job(name: str = "demo", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Meta-Llama-3-8B"},
            "dataset": {"name": "tatsu-lab/alpaca", "format": "instruction"},
            "storage": {"claimName": "shared"},
        },
    }
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def load_example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples" / name).read_text())
    return data


def with_path(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of doc with the dotted path set (intermediate maps created); value None deletes."""
    out = copy.deepcopy(doc)
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return out


def stored_reporter_rbac(resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The namespace's reporter Role or RoleBinding as the operator made it, for fake API clients
    whose `get` must answer the resync's reporter check (`operator/reporter.py`) with "in place"."""
    from llmtrain.operator.kube import resource_of
    from llmtrain.render.rbac import render_reporter_rbac

    for obj in render_reporter_rbac(namespace):
        if resource_of(obj) is resource and obj["metadata"]["name"] == name:
            return obj
    return None

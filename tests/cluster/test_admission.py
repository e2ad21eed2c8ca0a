"""Bad specs meet the real API server: every spec of the unit corpus that a CRD can judge is refused
by `kubectl apply` with a message naming the field (the rest, inside the opaque inline model config,
are the operator's to refuse: test_reconcile.py), and the immutability (transition) rules hold on
real updates."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import apply_doc, get
from tests.support.jobs import minimal_job, with_path
from tests.unit.test_bad_specs import ACCEPTED, BAD, accepted_doc, cel_messages


@pytest.fixture(scope="module")
def bad_ns(cluster: Cluster, platform: str) -> Iterator[str]:
    name = "t-bad-specs"
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


CRD_BAD = [b for b in BAD if b[3]]


@pytest.mark.parametrize(("doc", "field"), [(b[1], b[2]) for b in CRD_BAD], ids=[b[0] for b in CRD_BAD])
def test_real_api_server_rejects_bad_spec_naming_the_field(
    cluster: Cluster, bad_ns: str, doc: dict[str, Any], field: str
) -> None:
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = bad_ns
    result = apply_doc(cluster, doc, check=False)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert field.split(".")[-1] in result.stderr, result.stderr
    assert get(cluster, "llmtj", doc["metadata"]["name"], bad_ns) is None
    # The second CEL engine: the real server's cel-go refuses with each message the product's
    # engine (`llmtrain validate`) finds, so both judge the rules alike.
    for message in cel_messages(doc):
        assert message in result.stderr, (message, result.stderr)


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"memory": "2GB"}, "resources.memory must be a Kubernetes quantity: use e.g. 64Gi ("),
        ({"cpu": "two"}, "resources.cpu must be a Kubernetes quantity: use e.g. 8 ("),
    ],
    ids=["memory-2GB", "cpu-two"],
)
def test_real_api_server_tells_a_malformed_quantity_its_field_and_an_example(
    cluster: Cluster, bad_ns: str, resources: dict[str, str], message: str
) -> None:
    """Once, the API server answered with the quantity's 100-character OpenAPI pattern; now a CEL
    rule answers, with one message (the positivity rule leaves a malformed value to it)."""
    doc = minimal_job("bad-quantity", bad_ns, resources=resources)
    result = apply_doc(cluster, doc, check=False)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert message in result.stderr and result.stderr.count("must be") == 1, result.stderr
    assert "[0-9]" not in result.stderr, result.stderr


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[p for p, _ in ACCEPTED])
def test_real_api_server_accepts_what_validate_accepts(
    cluster: Cluster, bad_ns: str, path: str, value: Any
) -> None:
    """The other side of `llmtrain validate` being as strict as the server: no stricter either."""
    doc = accepted_doc(path, value)
    doc["metadata"].update(name="accepted-" + path.replace(".", "-").lower(), namespace=bad_ns)
    try:
        result = apply_doc(cluster, doc, check=False)
        assert result.returncode == 0, result.stderr
    finally:
        cluster.kubectl("delete", "llmtj", doc["metadata"]["name"], "-n", bad_ns, "--wait=false", check=False)


# (field path under spec, new value): each section is fixed at creation.
IMMUTABLE = [
    ("training.learningRate", 0.5),
    ("strategy", {"type": "deepspeed", "deepspeed": {"zeroStage": 2}}),
    ("resources.workers", 7),
    ("dataset.name", "other/dataset"),
    ("model.name", "other/model"),
    # Inside an x-kubernetes-preserve-unknown-fields object: the real server's CEL sees it too.
    ("model.config.hidden_size", 128),
    ("storage", {"claimName": "another"}),
    ("runPolicy.maxRetries", 9),
    ("runPolicy.queueName", "gpu-queue"),  # joining a queue later would bypass Kueue's admission
    ("resumeFrom", {"run": "old-job/uid-0"}),  # a running run would load another run's state
]
MESSAGES = {
    "runPolicy.queueName": "spec.runPolicy.queueName cannot be added or removed after creation",
    "resumeFrom": "spec.resumeFrom cannot be added or removed after creation",
}


@pytest.mark.parametrize(("path", "value"), IMMUTABLE, ids=[p for p, _ in IMMUTABLE])
def test_transition_rules_refuse_real_updates(cluster: Cluster, bad_ns: str, path: str, value: Any) -> None:
    name = "immutable-" + path.replace(".", "-").replace("_", "-").lower()
    doc = minimal_job(name, bad_ns)
    if path.startswith("model.config"):
        doc["spec"]["model"] = {
            "config": {"model_type": "llama", "hidden_size": 64},
            "tokenizer": "byte-level",
        }
    cluster.kubectl("delete", "llmtj", name, "-n", bad_ns, "--ignore-not-found", "--wait=true")
    apply_doc(cluster, doc)
    try:
        changed = with_path(doc, f"spec.{path}", value)
        result = cluster.kubectl(
            "replace", "-f", "-", input=yaml.safe_dump(_with_version(cluster, changed)), check=False
        )
        assert result.returncode != 0, result.stdout
        section = path.split(".")[0] if path.split(".")[0] != "runPolicy" else path
        expected = MESSAGES.get(path, f"spec.{section} is immutable")
        assert expected in result.stderr, result.stderr
        # Mutable fields still change: a label, and the run policy's deadline.
        relabelled = with_path(doc, "metadata.labels", {"team": "nlp"})
        relabelled = with_path(relabelled, "spec.runPolicy.activeDeadlineSeconds", 3600)
        cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(_with_version(cluster, relabelled)))
    finally:
        cluster.kubectl("delete", "llmtj", name, "-n", bad_ns, "--wait=false", check=False)


def _with_version(cluster: Cluster, doc: dict[str, Any]) -> dict[str, Any]:
    live = get(cluster, "llmtj", doc["metadata"]["name"], doc["metadata"]["namespace"])
    assert live is not None
    out = copy.deepcopy(doc)
    out["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
    return out

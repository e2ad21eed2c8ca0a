"""A CRD newer than the operator (applied first, as Argo CD and Flux's CreateReplace do) stores
fields this operator does not declare: the operator ignores them and runs the job, while admission
and `llmtrain validate` still refuse unknown fields. The cluster tier patches a live CRD
(tests/cluster/test_versions.py)."""

from __future__ import annotations

import pytest
from llmtrain.api.validation import InvalidJob, declared_only, parse_job, parse_stored_job

from tests.support.jobs import minimal_job, with_path

NEWER = {
    "spec.elasticity": {"mode": "none"},  # a new top-level section, defaulted by the new CRD
    "spec.resources.gpuSharing": "exclusive",  # a new field inside a known section
    "spec.runPolicy.backoffSeconds": 600,
}


@pytest.mark.parametrize("path", sorted(NEWER))
def test_a_field_from_a_newer_crd_is_ignored_in_a_stored_job_and_refused_by_validate(path: str) -> None:
    doc = with_path(minimal_job(), path, NEWER[path])
    stored = parse_stored_job(doc)
    assert stored.to_wire()["spec"] == parse_job(minimal_job()).to_wire()["spec"]
    with pytest.raises(InvalidJob) as refused:
        parse_job(doc)
    assert any(p.path == "." + path for p in refused.value.problems), refused.value.problems


def test_a_stored_job_is_still_checked_for_every_field_it_declares() -> None:
    doc = with_path(minimal_job(), "spec.resources.workers", "2")
    with pytest.raises(InvalidJob, match=r"spec\.resources\.workers"):
        parse_stored_job(doc)


def test_maps_and_metadata_are_kept_whole() -> None:
    doc = with_path(minimal_job(), "spec.resources.nodeSelector", {"pool": "a100"})
    doc["metadata"]["labels"] = {"team": "nlp"}
    wire = parse_stored_job(doc).to_wire()
    assert wire["spec"]["resources"]["nodeSelector"] == {"pool": "a100"}
    assert wire["metadata"]["labels"] == {"team": "nlp"}


def test_a_newer_field_inside_a_list_item_is_ignored_in_a_stored_job() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    doc = with_path(minimal_job(), "spec.resources.tolerations", [{**toleration, "tolerationSeconds2": 5}])
    stored = parse_stored_job(doc).to_wire()
    assert stored["spec"]["resources"]["tolerations"] == [toleration]
    with pytest.raises(InvalidJob, match="tolerationSeconds2"):
        parse_job(doc)


def test_pruning_follows_the_schema_as_the_api_server_prunes() -> None:
    """Each kind of node the API server prunes by, on a schema of its own: declared fields, a map
    of objects, a preserve-unknown object with fields, a free-form object and a list of objects."""
    item = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    schema = {
        "type": "object",
        "properties": {
            "known": {"type": "string"},
            "byName": {"type": "object", "additionalProperties": item},
            "open": {**item, "x-kubernetes-preserve-unknown-fields": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "list": {"type": "array", "items": item},
        },
    }
    doc = {
        "known": "k",
        "new": 1,
        "byName": {"x": {"a": 1, "new": 2}},
        "open": {"a": 1, "new": {"b": 2}},
        "free": {"any": {"thing": 1}},
        "list": [{"a": 1, "new": 3}],
    }
    assert declared_only(doc, schema) == {
        "known": "k",
        "byName": {"x": {"a": 1}},
        "open": {"a": 1, "new": {"b": 2}},
        "free": {"any": {"thing": 1}},
        "list": [{"a": 1}],
    }

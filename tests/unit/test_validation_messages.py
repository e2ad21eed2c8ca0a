"""The exact words `llmtrain validate` and the operator give for each kind of bad field: the path as
kubectl prints it and the fix (api/validation.py). A rewording shows here as a diff to review."""

from __future__ import annotations

from typing import Any

import pytest
from llmtrain.api.validation import (
    InvalidJob,
    Problem,
    _hint,
    _loc_to_path,
    _pydantic_problems,
    as_decoded,
    declared_only,
    parse_job,
    problems_of,
)
from pydantic import BaseModel, ConfigDict, ValidationError

from tests.support.jobs import minimal_job, with_path

UNKNOWN = "unknown field: remove it or check its spelling (`kubectl explain llmtj.spec`)"
DNS_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _problems(path: str, value: Any) -> list[str]:
    return [str(p) for p in problems_of(with_path(minimal_job(), path, value))]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.bogus", 1, f".spec.bogus: {UNKNOWN}"),
        (
            "spec.resources.tolerations",
            [{"key": "a", "bogus": 1}],
            f".spec.resources.tolerations[0].bogus: {UNKNOWN}",
        ),
        ("spec.method.type", "qlora", ".spec.method.type: must be one of 'full' or 'lora'"),
        ("spec.strategy.type", "fsdp3", ".spec.strategy.type: must be one of 'fsdp', 'deepspeed' or 'ddp'"),
        (
            "spec.storage.claimName",
            "Bad_Name",
            f".spec.storage.claimName: invalid value 'Bad_Name': must match {DNS_NAME}",
        ),
        ("spec.resources.workers", "2", ".spec.resources.workers: Input should be a valid integer (got '2')"),
        ("spec.resources.workers", 2.5, ".spec.resources.workers: Input should be a valid integer (got 2.5)"),
        # A mapping is not echoed back: it would bury the message.
        ("spec.resources.workers", {"a": 1}, ".spec.resources.workers: Input should be a valid integer"),
    ],
)
def test_each_kind_of_bad_field_is_named_with_its_fix(path: str, value: Any, expected: str) -> None:
    assert _problems(path, value) == [expected]


def test_a_missing_field_and_a_document_that_is_no_mapping() -> None:
    doc = minimal_job()
    del doc["spec"]["model"]
    assert [str(p) for p in problems_of(doc)] == [".spec.model: required field is missing: add it"]
    assert problems_of(["a list"]) == [
        Problem(".", "the document must be a YAML mapping (an LLMTrainingJob object)")
    ]
    assert problems_of(minimal_job()) == []


def test_every_problem_is_in_the_error_text() -> None:
    doc = with_path(with_path(minimal_job(), "spec.bogus", 1), "spec.method.type", "qlora")
    with pytest.raises(InvalidJob) as refused:
        parse_job(doc)
    # In the order of the model's fields, whatever the document's order.
    assert str(refused.value) == f".spec.method.type: must be one of 'full' or 'lora'; .spec.bogus: {UNKNOWN}"
    assert len(refused.value.problems) == 2


def test_paths_and_hints_of_pydantic_errors() -> None:
    assert _loc_to_path(()) == "."
    assert (
        _loc_to_path(("spec", "resources", "tolerations", 0, "key")) == ".spec.resources.tolerations[0].key"
    )
    assert _hint({"type": "extra_forbidden", "msg": "x"}) == UNKNOWN
    assert _hint({"type": "missing", "msg": "x"}) == "required field is missing: add it"
    assert (
        _hint({"type": "literal_error", "msg": "x", "ctx": {"expected": "'a' or 'b'"}})
        == "must be one of 'a' or 'b'"
    )
    pattern = {"type": "string_pattern_mismatch", "msg": "x", "input": "A", "ctx": {"pattern": "^a$"}}
    assert _hint(pattern) == "invalid value 'A': must match ^a$"
    assert _hint({"type": "int_type", "msg": "not an integer", "input": [1]}) == "not an integer (got [1])"
    assert _hint({"type": "int_type", "msg": "not an integer", "input": {"a": 1}}) == "not an integer"
    assert _hint({"type": "int_type", "msg": "not an integer"}) == "not an integer"


def test_only_a_whole_float_in_an_integer_field_becomes_an_integer() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "ns": {"type": "array", "items": {"type": "integer"}},
            "deep": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
        "additionalProperties": False,
    }
    doc = {"n": 2.0, "x": 2.0, "ns": [1.0, 2.5], "deep": {"n": 3.0}, "other": 4.0}
    decoded = as_decoded(doc, schema)
    assert decoded == {"n": 2, "x": 2.0, "ns": [1, 2.5], "deep": {"n": 3}, "other": 4.0}
    assert [type(decoded[k]) for k in ("n", "x")] == [int, float]
    assert type(decoded["ns"][0]) is int and type(decoded["deep"]["n"]) is int
    assert type(decoded["other"]) is float  # undeclared: no schema to say it is an integer
    mapped = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert as_decoded({"a": 1.0}, mapped) == {"a": 1} and type(as_decoded({"a": 1.0}, mapped)["a"]) is int
    assert as_decoded(True, {"type": "integer"}) is True  # a bool is no float
    assert as_decoded("2.0", {"type": "integer"}) == "2.0"


def test_a_snake_case_key_is_an_unknown_field_as_in_the_api_server() -> None:
    assert f".spec.storage.claim_name: {UNKNOWN}" in _problems("spec.storage", {"claim_name": "shared"})


def test_a_union_fields_member_types_are_left_out_of_the_path() -> None:
    class Member(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    class Doc(BaseModel):
        x: int | float
        y: list[int] | str
        z: int | Member

    with pytest.raises(ValidationError) as refused:
        Doc.model_validate({"x": "1", "y": 2, "z": {"b": 1}}, strict=True)
    raw = [".".join(map(str, e["loc"])) for e in refused.value.errors()]
    assert raw[:5] == ["x.int", "x.float", "y.list[int]", "y.str", "z.int"]
    # The member's name stays where it names a model: it says which shape was meant.
    paths = [p.path for p in _pydantic_problems(refused.value)]
    assert paths == [".x", ".x", ".y", ".y", ".z", ".z.Member.a", ".z.Member.b"]


def _inline_model(**config: Any) -> dict[str, Any]:
    doc = minimal_job()
    doc["spec"]["model"] = {"config": {"model_type": "llama", **config}, "tokenizer": "byte-level"}
    doc["spec"]["dataset"] = {"path": "data/x.jsonl", "format": "text", "maxSeqLength": 64}
    return doc


def test_the_inline_model_configs_problems_come_with_the_specs_and_their_paths() -> None:
    doc = _inline_model(hidden_size=64, num_attention_heads=5, max_position_embeddings=32)
    doc["spec"]["dataset"]["path"] = "s3://bucket/x.jsonl"  # a CEL rule: no spec.objectStorage
    found = [str(p) for p in problems_of(doc)]
    assert found[-2:] == [
        ".spec.model.config.hidden_size: hidden_size 64 is not divisible by num_attention_heads 5; "
        "change one of them or set head_dim",
        ".spec.dataset.maxSeqLength: dataset.maxSeqLength 64 is longer than "
        "model.config.max_position_embeddings 32: the model has no positions past it; lower "
        "dataset.maxSeqLength to at most 32 or raise model.config.max_position_embeddings",
    ]
    assert "dataset.path is an s3:// URI: set spec.objectStorage" in found[0], found
    assert len(found) == 3


def test_positions_of_zero_are_one_problem_not_two() -> None:
    assert [str(p) for p in problems_of(_inline_model(max_position_embeddings=0))] == [
        ".spec.model.config.max_position_embeddings: must be a positive integer (got 0)"
    ]


def test_an_update_is_checked_against_the_old_object() -> None:
    doc = with_path(minimal_job(), "spec.runPolicy", {"maxRetries": 1})
    old = parse_job(doc).to_wire()
    changed = with_path(minimal_job(), "spec.runPolicy", {"maxRetries": 2})
    assert problems_of(changed) == []  # a create: no old object
    with pytest.raises(InvalidJob) as refused:
        parse_job(changed, old=old)
    assert [str(p) for p in refused.value.problems] == [
        ".spec.runPolicy.maxRetries: spec.runPolicy.maxRetries is immutable after creation: create a new "
        "LLMTrainingJob (or delete and re-apply this one) to change it"
    ]
    assert parse_job(doc, old=old).to_wire() == old


def test_a_list_whose_schema_declares_no_items_is_kept_whole() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array"}}}
    assert declared_only({"xs": [{"a": 1}], "other": 1}, schema) == {"xs": [{"a": 1}]}

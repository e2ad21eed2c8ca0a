"""How api/cel.py walks a schema: rules under maps and lists, paths, messages, transition rules with
the old object, and values typed as the API server types them. On small schemas of their own, so
each behaviour is checked apart from the CRD's rules (tests/unit/test_cel_rules.py)."""

from __future__ import annotations

from typing import Any

from llmtrain.api.cel import RuleViolation, violations

# Arithmetic mixing an int and a double is a CEL error (a comparison is not): these rules fail on a
# value left an int where the schema says `number`.
POSITIVE = {"rule": "self + 0.5 > 1.0", "message": "must be above 0.5"}
NO_SHRINK = {"rule": "self - oldSelf >= 0.0", "message": "may not shrink"}


def _map_of(value_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"sizes": {"type": "object", "additionalProperties": value_schema}},
    }


def test_rules_under_a_map_run_for_each_value_with_its_key_in_the_path() -> None:
    schema = _map_of({"type": "number", "x-kubernetes-validations": [POSITIVE]})
    # Integers in a `number` field are doubles to CEL, as the API server types them: 2 passes.
    assert violations(schema, {"sizes": {"a": 2, "b": 0}}) == [
        RuleViolation(".sizes['b']", "must be above 0.5", POSITIVE["rule"])
    ]


def test_transition_rules_under_a_map_see_the_old_value_of_the_same_key() -> None:
    schema = _map_of({"type": "number", "x-kubernetes-validations": [NO_SHRINK]})
    new = {"sizes": {"a": 2, "b": 1, "c": 1}}
    old = {"sizes": {"a": 1, "b": 3}}  # c is new: no old value, so its transition rule does not run
    assert violations(schema, new, old=old) == [
        RuleViolation(".sizes['b']", "may not shrink", NO_SHRINK["rule"])
    ]
    assert violations(schema, new) == []  # no old object: a create


def test_the_old_object_is_typed_too() -> None:
    schema = {"type": "number", "x-kubernetes-validations": [NO_SHRINK]}
    # Both sides doubles: an int minus a double would be a CEL error, which counts as a failure.
    assert violations(schema, 2.5, old=2) == []
    assert violations(schema, 2, old=3) == [RuleViolation(".", "may not shrink", NO_SHRINK["rule"])]


def test_list_items_are_typed_and_walked_with_their_index() -> None:
    schema = {
        "type": "object",
        "properties": {
            "xs": {"type": "array", "items": {"type": "number", "x-kubernetes-validations": [POSITIVE]}}
        },
    }
    assert violations(schema, {"xs": [1, 0, 3]}) == [
        RuleViolation(".xs[1]", "must be above 0.5", POSITIVE["rule"])
    ]
    # A value of the wrong type is the type check's to refuse: its characters are no items.
    assert violations(schema, {"xs": "abc"}) == []


def test_a_rule_at_the_root_without_a_message_names_the_rule() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.a == 1"}]}
    assert violations(schema, {"a": 2}) == [RuleViolation(".", "failed rule: self.a == 1", "self.a == 1")]
    with_field = {"type": "object", "x-kubernetes-validations": [{"rule": "self.a == 1", "fieldPath": ".a"}]}
    assert violations(with_field, {"a": 2}, path=".spec") == [
        RuleViolation(".spec.a", "failed rule: self.a == 1", "self.a == 1")
    ]


def test_a_rule_that_cannot_be_evaluated_fails() -> None:
    # `self.a` of an object without `a` is a CEL error, as in the API server (no has() guard).
    schema = {
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.a == 1", "message": "a must be 1"}],
    }
    assert violations(schema, {"b": 1}) == [RuleViolation(".", "a must be 1", "self.a == 1")]


def test_several_transition_rules_of_one_node_each_see_the_old_value() -> None:
    rules = [NO_SHRINK, {"rule": "self - oldSelf <= 10.0", "message": "may not grow by more than 10"}]
    schema = {"type": "number", "x-kubernetes-validations": rules}
    assert violations(schema, 5, old=4) == []
    assert [v.message for v in violations(schema, 3, old=4)] == ["may not shrink"]
    assert [v.message for v in violations(schema, 20, old=4)] == ["may not grow by more than 10"]


def test_lists_inside_a_free_form_field_are_walked_without_a_schema() -> None:
    # model.config is preserve-unknown: its lists (`architectures`) have no items schema.
    schema = {
        "type": "object",
        "properties": {"config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        "x-kubernetes-validations": [{"rule": "size(self.config.architectures) == 1", "message": "one"}],
    }
    doc = {"config": {"architectures": ["LlamaForCausalLM"], "nested": [{"a": [1, 2.5]}]}}
    assert violations(schema, doc) == []

"""The API reference's generator (api/reference.py) on a small schema of its own: each kind of field,
bound and rule in a reader's words, and the README summary's markers. test_generated_docs.py checks
that the committed docs equal what it makes from the models."""

from __future__ import annotations

import re
from typing import Any

import pytest
from llmtrain.api.reference import (
    SUMMARY_BEGIN,
    SUMMARY_END,
    _anchor,
    _bounds,
    _type,
    api_reference,
    readme_summary,
    with_summary,
)

TINY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "description": "What to run.",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^" + "a" * 46 + "$"},
                "labels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
                "anything": {},
                "ports": {
                    "type": "array",
                    "items": {
                        "type": "integer",
                        "minimum": 1,
                        "x-kubernetes-validations": [{"rule": "self != 22", "message": "port 22 is taken"}],
                    },
                },
                "named": {
                    "type": "object",
                    "additionalProperties": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
                "size": {"type": "string", "minLength": 1, "exclusiveMinimum": True},
            },
        },
        "status": {
            "type": "object",
            "properties": {"phase": {"type": "string", "description": "Where it is."}},
        },
    },
}

SPEC_SECTION = """## spec

What to run.

| field | type | default | description |
|---|---|---|---|
| `name` | string (pattern `^aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa$`) | required |  |
| `labels` | map of string (1 ≤ entries) |  |  |
| `anything` | any |  |  |
| `ports` | list of integer (each: 1 ≤ value) |  | Rule: port 22 is taken. |
| `named` | map of [object](#specnamed) |  |  |
| `size` | string (1 ≤ length) |  |  |

## status



| field | type | default | description |
|---|---|---|---|
| `phase` | string |  | Where it is. |
"""


def test_the_reference_of_a_small_schema() -> None:
    text = api_reference(TINY)
    assert text.startswith("# API reference: LLMTrainingJob (`llmtrain.dev/v1alpha1`)\n")
    assert "\nSections: [spec](#spec), [status](#status).\n" in text
    # A schema without a description leaves its line empty; the text ends with one newline.
    assert text.splitlines()[5] == ""
    assert text.endswith("\n\n" + SPEC_SECTION)
    assert api_reference({**TINY, "description": "A tiny job."}).splitlines()[5] == "A tiny job."


def test_bounds_types_and_anchors_in_a_readers_words() -> None:
    assert _anchor("Spec Resources.GPU") == "spec-resourcesgpu"
    assert _type({}, "spec.x") == "any"
    assert _bounds({"minimum": 0, "exclusiveMinimum": True, "maximum": 1}) == ["0 < value ≤ 1"]
    assert _bounds({"maxProperties": 4}) == ["entries ≤ 4"]
    assert _bounds({"pattern": "a" * 48}) == [f"pattern `{'a' * 48}`"]
    assert _bounds({"pattern": "a" * 49}) == ["pattern (see the CRD)"]


def test_the_readme_summary_of_a_small_schema() -> None:
    summary = readme_summary(TINY)
    lines = summary.splitlines()
    assert lines[0] == SUMMARY_BEGIN and lines[-1] == SUMMARY_END
    assert lines[1:3] == ["| section | what it holds | fields |", "|---|---|---|"]
    assert "| [`named`](docs/api.md#specnamed) |  |  |" in lines
    sectioned = {
        **TINY,
        "properties": {
            **TINY["properties"],
            "spec": {
                "type": "object",
                "properties": {
                    "run": {"type": "object", "description": "How | why.", "properties": {"a": {}, "b": {}}}
                },
            },
        },
    }
    assert (
        readme_summary(sectioned).splitlines()[3]
        == "| [`run`](docs/api.md#specrun) | How \\| why. | `a`, `b` |"
    )


def test_the_summary_replaces_the_text_between_its_markers() -> None:
    readme = f"intro\n{SUMMARY_BEGIN}\nold table\n{SUMMARY_END}\nrest\n"
    assert with_summary(readme, TINY) == f"intro\n{readme_summary(TINY)}\nrest\n"
    with pytest.raises(ValueError, match=re.escape(f"README.md has no line {SUMMARY_BEGIN!r}")):
        with_summary("intro\n", TINY)
    with pytest.raises(ValueError, match=re.escape(f"README.md has no line {SUMMARY_END!r}")):
        with_summary(f"intro\n{SUMMARY_BEGIN}\n", TINY)

"""Plain YAML scalars typed as kubectl (sigs.k8s.io/yaml, go-yaml v2 rules) types them, where
PyYAML's YAML 1.1 differs; the strict parse of `llmtrain validate` judges these types."""

from __future__ import annotations

import math
from typing import Any

import pytest
from llmtrain.api.manifest_yaml import go_scalar, load_all


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2e-5", 2e-5),  # PyYAML: the string "2e-5"
        ("1e3", 1000.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("08", 8.0),  # not octal: Go falls back to a float
        ("017", 15),
        ("0x1F", 31),
        ("0o17", 15),  # PyYAML: a string
        ("0b101", 5),
        ("1_000", 1000),
        ("-3", -3),
        ("y", True),  # PyYAML: the string "y"
        ("N", False),
        ("yes", True),
        ("off", False),
        ("~", None),
        ("", None),
        ("1:30", "1:30"),  # PyYAML: sexagesimal 90
        ("2024-01-01", "2024-01-01"),  # PyYAML: a date; kubectl's JSON: a string
        ("true-ish", "true-ish"),
        ("64Gi", "64Gi"),
        ("500m", "500m"),
        ("1e", "1e"),
        ("18446744073709551616", 1.8446744073709552e19),  # past uint64: a float
        ("-9223372036854775808", -9223372036854775808),  # int64's least value is still an integer
    ],
)
def test_plain_scalars(text: str, value: Any) -> None:
    assert go_scalar(text) == value
    assert type(go_scalar(text)) is type(value)


def test_special_floats() -> None:
    assert math.isnan(go_scalar(".NaN"))
    assert go_scalar("-.inf") == -math.inf


def test_quoted_and_tagged_scalars_stay_strings_and_keys_are_strings() -> None:
    (doc,) = load_all('a: "yes"\nb: \'4\'\nc: !!str 2e-5\n1: one\nyes: two\nlist: [y, "y"]\n')
    assert doc == {"a": "yes", "b": "4", "c": "2e-5", "1": "one", "true": "two", "list": [True, "y"]}


def test_anchors_and_merge_keys_still_work() -> None:
    (doc,) = load_all("base: &b {cpu: 8}\nworker: {<<: *b, memory: 64Gi}\n")
    assert doc["worker"] == {"cpu": 8, "memory": "64Gi"}


def test_every_kind_of_key_becomes_the_string_kubectl_sends() -> None:
    """sigs.k8s.io/yaml writes each mapping key as a JSON string, nested mappings included."""
    (doc,) = load_all("no: a\nyes: b\n~: c\nnull: d\n1.5: e\n0x10: f\nkey: g\nouter: {off: h, 2: i}\n")
    assert doc == {
        "false": "a",
        "true": "b",
        "null": "d",  # `~` and `null` are the same key: the later one wins
        "1.5": "e",
        "16": "f",
        "key": "g",
        "outer": {"false": "h", "2": "i"},
    }

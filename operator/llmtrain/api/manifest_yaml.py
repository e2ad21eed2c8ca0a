"""Read a manifest file the way `kubectl apply` does, so the strict parse sees the server's types.

kubectl turns YAML into JSON with sigs.k8s.io/yaml, which resolves untagged plain scalars by the rules
of go-yaml v2; PyYAML's YAML 1.1 rules differ in places a spec meets: `2e-5` and `1e3` are numbers
to kubectl and strings to PyYAML, `y`/`n` are booleans to kubectl only, `1:30` is a sexagesimal
integer to PyYAML only, `2024-01-01` a date to PyYAML and a string in kubectl's JSON. With the
lax parse these mismatches were coerced away; the strict one (validation.parse_job) would refuse a
`learningRate: 2e-5` that the API server takes. Quoted and explicitly tagged scalars are strings
(or their tag) in both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import yaml

_PLAIN = "tag:llmtrain.dev,2026:plain"
_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_KEYWORDS: dict[str, Any] = {
    **dict.fromkeys(_TRUE, True),
    **dict.fromkeys(_FALSE, False),
    **dict.fromkeys(("~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
# strconv.ParseInt(s, 0, 64): an optional sign, then 0x/0o/0b prefixes, a leading 0 for octal.
_GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_BASES = {"x": 16, "X": 16, "o": 8, "O": 8, "b": 2, "B": 2}
# go-yaml v2's yamlStyleFloat, and its float after a leading '.'.
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?")
_INT64 = 2**63


def _go_int(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[1] in _BASES:
        return sign * int(digits[2:], _BASES[digits[1]])
    return sign * int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)


def go_scalar(text: str) -> Any:
    """An untagged plain scalar as go-yaml v2 resolves it (a timestamp stays a string, as kubectl's
    JSON writes it)."""
    if text == "":
        return None
    if text[0] not in "yYnNtTfFoO~.+-0123456789":
        return text
    if text in _KEYWORDS:
        return _KEYWORDS[text]
    if text[0] == ".":
        return float(text) if _DOT_FLOAT.fullmatch(text) else text
    if text[0] not in "+-0123456789" or _TIMESTAMP.fullmatch(text):
        return text
    plain = text.replace("_", "")
    if _GO_INT.fullmatch(plain):
        value = _go_int(plain)
        if -_INT64 <= value < 2 * _INT64:  # int64, else uint64
            return value
    if _GO_FLOAT.fullmatch(plain):
        return float(plain)
    return text


def _json_key(key: Any) -> Any:
    """sigs.k8s.io/yaml writes every mapping key as a JSON string."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return key if isinstance(key, str) else str(key)


class _KubectlLoader(yaml.SafeLoader):
    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0] and value != "<<":
            return _PLAIN
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in the stubs

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Keys become strings as they are read: `1:` and `yes:` stay two keys ("1", "true").
        self.flatten_mapping(node)
        return {
            _json_key(self.construct_object(k, deep=deep)): self.construct_object(v, deep=deep)
            for k, v in node.value
        }


_KubectlLoader.add_constructor(_PLAIN, lambda loader, node: go_scalar(node.value))


def load_all(text: str) -> Iterator[Any]:
    """Every document of a YAML stream, typed as kubectl sends it to the API server."""
    yield from yaml.load_all(text, Loader=_KubectlLoader)  # a SafeLoader subclass: no object tags

"""Label and field selectors as the API server parses them from `?labelSelector=` and `?fieldSelector=`.

A malformed selector is a 400 in Kubernetes, so parsing raises ValueError instead of matching nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_SET_OP = re.compile(r"(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)")
_EQ_OP = re.compile(r"(?P<key>[^\s!=]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)")
_EXISTS = re.compile(r"(?P<neg>!?)\s*(?P<key>\S+)")
FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "exists":
                return present
            case "!":
                return not present
            case "=" | "in":
                return present and value in self.values
            case _:  # "!=" and "notin" also match objects without the label
                return not present or value not in self.values


def parse_labels(text: str) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k` (commas inside parentheses do not split)."""
    requirements = []
    for part in _split(text):
        if m := _SET_OP.fullmatch(part):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirement = Requirement(m["key"], m["op"], values)
        elif m := _EQ_OP.fullmatch(part):
            requirement = Requirement(m["key"], "=" if m["op"] == "==" else m["op"], frozenset({m["value"]}))
        elif m := _EXISTS.fullmatch(part):
            requirement = Requirement(m["key"], "!" if m["neg"] else "exists")
        else:
            raise ValueError(f"unable to parse requirement: {part!r}")
        if not _KEY.fullmatch(requirement.key):
            raise ValueError(f"invalid label key {requirement.key!r}")
        if bad := [v for v in requirement.values if not _VALUE.fullmatch(v) or len(v) > 63]:
            raise ValueError(f"invalid label value {bad[0]!r}")
        requirements.append(requirement)
    return requirements


def parse_fields(text: str) -> list[Requirement]:
    """Parse `metadata.name=x,metadata.namespace!=y`; custom resources support only these two fields."""
    requirements = []
    for part in _split(text):
        m = _EQ_OP.fullmatch(part)
        if not m:
            raise ValueError(f"invalid field selector: {part!r}")
        if m["key"] not in FIELDS:
            raise ValueError(f"field label not supported: {m['key']}")
        requirements.append(
            Requirement(m["key"], "=" if m["op"] == "==" else m["op"], frozenset({m["value"]}))
        )
    return requirements


def matches(obj: dict[str, Any], labels: list[Requirement], fields: list[Requirement]) -> bool:
    meta = obj.get("metadata") or {}
    field_values = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace") or ""}
    return all(r.matches(meta.get("labels") or {}) for r in labels) and all(
        r.matches(field_values) for r in fields
    )


def _split(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return [p for p in parts if p]

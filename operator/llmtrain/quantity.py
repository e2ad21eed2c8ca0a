"""The little Kubernetes quantity arithmetic the models and rendering need (CPU cores, bytes)."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX: dict[str, Decimal | int] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_RE = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$")


def parse_quantity(text: str) -> Decimal:
    match = _RE.match(text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in "eE" and suffix:
        return Decimal(number + suffix)
    return Decimal(number) * Decimal(_SUFFIX[suffix])


def cpu_cores(text: str) -> float:
    return float(parse_quantity(text))

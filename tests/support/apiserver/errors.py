"""Kubernetes `Status` errors shaped like the real API server's.

Clients classify failures by `code` and `reason` (Kopf retries 5xx and 429, the official client raises
`ApiException(status=...)`), and people read `message` and `details.causes`, so all three follow the
wording of the real server closely enough that a test can assert on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import attrs
import kmock

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@attrs.frozen
class StatusError(kmock.KubernetesError):
    """An API error answered as a `Status` object; `retry_after` becomes the Retry-After header."""

    retry_after: float | None = None

    @classmethod
    def of(cls, code: int, message: str, *, reason: str | None = None, **kwargs: Any) -> StatusError:
        return cls(status=code, reason=reason or REASONS.get(code, "Unknown"), message=message, **kwargs)

    def body(self) -> dict[str, Any]:
        return status_body(
            self.status, self.reason or REASONS.get(self.status, ""), self.message or "", self.details
        )

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}


def status_body(code: int, reason: str, message: str, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def render_value(value: Any) -> str:
    """How field errors quote a value: scalars as JSON, containers by type name (as Go's errors do)."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


@dataclass(frozen=True)
class FieldError:
    """One entry of `details.causes`: a field path, a machine-readable reason and the message."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    @classmethod
    def required(cls, field: str, detail: str = "") -> FieldError:
        return cls(field, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))

    @classmethod
    def invalid(cls, field: str, value: Any, detail: str, reason: str = "FieldValueInvalid") -> FieldError:
        return cls(field, reason, f"Invalid value: {render_value(value)}: {detail}")

    @classmethod
    def type_invalid(cls, field: str, value: Any, expected: str) -> FieldError:
        actual = json_type(value)
        message = f'Invalid value: "{actual}": {field} in body must be of type {expected}: "{actual}"'
        return cls(field, "FieldValueTypeInvalid", message)

    @classmethod
    def not_supported(cls, field: str, value: Any, allowed: list[Any]) -> FieldError:
        supported = ", ".join(json.dumps(v) for v in allowed)
        return cls(
            field,
            "FieldValueNotSupported",
            f"Unsupported value: {render_value(value)}: supported values: {supported}",
        )

    @classmethod
    def duplicate(cls, field: str, value: Any) -> FieldError:
        return cls(field, "FieldValueDuplicate", f"Duplicate value: {render_value(value)}")

    @classmethod
    def forbidden(cls, field: str, detail: str) -> FieldError:
        return cls(field, "FieldValueForbidden", f"Forbidden: {detail}")


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> StatusError:
    """422 Invalid, worded as `Kind.group "name" is invalid: <field>: <message>`."""
    qualified = f"{kind}.{group}" if group else kind
    listed = str(errors[0]) if len(errors) == 1 else f"[{', '.join(map(str, errors))}]"
    details = {"name": name, "group": group, "kind": kind, "causes": [e.cause() for e in errors]}
    return StatusError.of(422, f'{qualified} "{name}" is invalid: {listed}', details=details)

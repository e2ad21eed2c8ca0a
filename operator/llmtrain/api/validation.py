"""Validate an LLMTrainingJob document offline, the way the API server would, with fixes.

Three layers: pydantic checks types, enums, ranges and patterns; the CRD's CEL rules check
cross-field constraints (both derived from the models, so the API server applies them too); and the
inline model config, which the CRD keeps opaque, is checked here only (`model_config`), which is why
the operator re-validates every spec before it creates anything. Each problem names the field path
and the fix.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from llmtrain.api import cel
from llmtrain.api.crd import openapi_schema
from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.model_config import config_problems, sequence_problems


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidJob(ValueError):
    """The document is not a valid LLMTrainingJob; `problems` lists every reason."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@functools.cache
def _schema() -> dict[str, Any]:
    return openapi_schema()


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out or "."


def _hint(err: dict[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown field: remove it or check its spelling (`kubectl explain llmtj.spec`)"
    if kind == "missing":
        return "required field is missing: add it"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"invalid value {err.get('input')!r}: must match {ctx.get('pattern')}"
    message: str = err["msg"]
    return (
        f"{message} (got {err.get('input')!r})"
        if "input" in err and not isinstance(err["input"], dict)
        else message
    )


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        # Optional/union fields add the type name to the location; drop those segments.
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"str", "int", "float"})))
        problems.append(Problem(_loc_to_path(loc), _hint(dict(err))))
    return problems


def as_decoded(value: Any, schema: dict[str, Any]) -> Any:
    """The document with the one coercion the API server makes: a whole-number float in an
    `integer` field (`workers: 2.0`) is accepted (kube-openapi's type check) and stored as an
    integer. Everything else keeps its JSON type, for the strict parse."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {
            k: as_decoded(v, props.get(k) or (extra if isinstance(extra, dict) else {}))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [as_decoded(v, schema.get("items", {})) for v in value]
    if schema.get("type") == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def declared_only(value: Any, schema: dict[str, Any]) -> Any:
    """The document without the fields `schema` does not declare, as the API server prunes them.

    For objects the API server stored: a CRD applied before this operator (Argo CD's order, and
    Flux's `CreateReplace`) may declare fields this version does not know, and their defaults then
    appear in every stored job. Those fields are a newer operator's business; this one parses the
    rest. Objects with no declared fields (metadata, preserved-unknown values) stay whole."""
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and not isinstance(extra, dict):
            return value
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = (props or {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                out[key] = declared_only(item, sub)
            elif keep_unknown:
                out[key] = item
        return out
    if isinstance(value, list):
        return [declared_only(item, schema.get("items", {})) for item in value]
    return value


def parse_stored_job(document: Any) -> LLMTrainingJob:
    """Parse a job the API server stored, ignoring fields this operator does not declare (see
    `declared_only`); everything it declares is validated as strictly as `parse_job` does.
    Admission (the CRD) and `llmtrain validate` stay strict: unknown fields are refused there."""
    return parse_job(declared_only(document, _schema()) if isinstance(document, dict) else document)


def parse_job(document: Any, old: dict[str, Any] | None = None) -> LLMTrainingJob:
    """Parse and fully validate; raise InvalidJob listing every problem.

    The parse is strict about JSON types, as the API server is: "yes" or "true" is not a boolean and
    "4" is not a number there, so neither is it here (pydantic's lax mode would coerce them, and
    `llmtrain validate` would pass a file `kubectl apply` refuses). An object the API server stored
    already has the server's types, so the operator's parse of it is no stricter than the server."""
    if not isinstance(document, dict):
        raise InvalidJob([Problem(".", "the document must be a YAML mapping (an LLMTrainingJob object)")])
    try:
        # Wire documents are camelCase only: a snake_case key is an unknown field to the API server.
        job = LLMTrainingJob.model_validate(
            as_decoded(document, _schema()), by_alias=True, by_name=False, strict=True
        )
    except ValidationError as exc:
        raise InvalidJob(_pydantic_problems(exc)) from None
    wire = job.to_wire()
    wire.pop("status", None)
    kwargs: dict[str, Any] = {}
    if old is not None:
        kwargs["old"] = old
    found = [Problem(v.path, v.message) for v in cel.violations(_schema(), wire, **kwargs)]
    if job.spec.model.config is not None:
        # Preserve-unknown in the CRD: only this check sees inside it, before anything is created.
        config = job.spec.model.config
        found += [Problem(path, message) for path, message in config_problems(config)]
        found += [
            Problem(path, message)
            for path, message in sequence_problems(config, job.spec.dataset.max_seq_length)
        ]
    if found:
        raise InvalidJob(found)
    return job


def problems_of(document: Any) -> list[Problem]:
    try:
        parse_job(document)
    except InvalidJob as exc:
        return exc.problems
    return []

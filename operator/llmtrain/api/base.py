"""Shared pydantic configuration and helpers for the API models.

Every model is camelCase on the wire (Kubernetes convention), forbids unknown fields (a typo must
fail, not be ignored) and carries CEL rules in its JSON schema so that the CRD, the offline
validator and the tests read the same rule text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

# Kubernetes resource.Quantity: the apiserver's own OpenAPI pattern, written with character classes
# instead of escapes so the same text is a Python regex, an RE2 regex and a CEL string literal.
QUANTITY_PATTERN = (
    "^[+-]?(([0-9]+([.][0-9]*)?)|([.][0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    "([eE][+-]?(([0-9]+([.][0-9]*)?)|([.][0-9]+))))?$"
)
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# An image reference as container runtimes parse it: [registry[:port]/]path[:tag][@digest], the
# path in lower case (the grammar of the distribution project's reference package).
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
IMAGE_REFERENCE = (
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*{_TAG}{_DIGEST}$"
)
# A qualified Kubernetes name such as nvidia.com/gpu or amd.com/gpu.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A label or annotation key: an optional DNS subdomain prefix and a name of at most 63 characters.
# In CEL (RE2) syntax, applied to map keys, which a CRD schema cannot constrain otherwise.
METADATA_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry; the message should say what to change."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


# A quantity field is checked by a CEL rule, not an OpenAPI `pattern`: the API server answers a
# pattern mismatch with the whole regex, a rule with its message, which names the field and an
# example. The same message comes from the pydantic check (KubeQuantity), so `llmtrain validate`
# and `kubectl apply` say the same thing.
QUANTITY_RULE = f"self.matches('{QUANTITY_PATTERN}')"

# A quantity whose mantissa has a non-zero digit and no sign but '+': greater than zero. Given a
# string the quantity pattern accepts, the prefix match stays inside the mantissa (every suffix and
# exponent starts with a letter). A regex because the product's offline CEL engine has no Kubernetes
# quantity library (`quantity(self).isGreaterThan(...)`), and the API server's OpenAPI `pattern` is
# RE2 (no lookahead to exclude zero); `matches` runs alike in both CEL engines. Only judged on a
# quantity: the API server runs every rule, and "two" should get one message, QUANTITY_RULE's.
POSITIVE_QUANTITY_RULE = f"!{QUANTITY_RULE} || self.matches('^[+]?[0-9]*[.]?[0-9]*[1-9]')"


def quantity_message(field: str, example: str) -> str:
    """What a malformed quantity is told, by the API server and by `llmtrain validate` alike."""
    return (
        f"{field} must be a Kubernetes quantity: use e.g. {example} (a number and an optional unit: "
        "Ki, Mi, Gi, Ti, k, M, G, T, or m for thousandths; no space; GB is not a unit)"
    )


def positive_quantity(field: str, example: str) -> JsonDict:
    """A quantity field's rules: well-formed, then greater than zero (a zero or negative quantity
    would be refused later with the pod, or never scheduled, or OOM at once)."""
    return {
        "x-kubernetes-validations": [
            cel(QUANTITY_RULE, quantity_message(field, example)),
            cel(
                POSITIVE_QUANTITY_RULE,
                f"{field} must be greater than zero: give a positive quantity such as '{example}'",
            ),
        ]
    }


@dataclass(frozen=True)
class KubeQuantity:
    """Marks a string field as a Kubernetes quantity, with the field's path and an example value for
    its messages (`Annotated[Quantity, KubeQuantity("resources.memory", "64Gi")]`): pydantic refuses
    a malformed one with `quantity_message`, and the CRD gets `positive_quantity`'s rules."""

    field: str
    example: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update(positive_quantity(self.field, self.example))
        return json_schema

    def _check(self, value: str) -> str:
        if not _QUANTITY.match(value):
            raise PydanticCustomError("quantity", quantity_message(self.field, self.example))
        return value


_QUANTITY = re.compile(QUANTITY_PATTERN)


def immutable(field: str) -> JsonDict:
    """Field-level transition rule: the value may not change after creation."""
    return {
        "x-kubernetes-validations": [
            cel(
                "self == oldSelf",
                f"spec.{field} is immutable after creation: create a new LLMTrainingJob "
                f"(or delete and re-apply this one) to change it",
            )
        ]
    }


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it is written to the Kubernetes API (camelCase, unset fields absent)."""
        data: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return data


def metadata_keys_rule(what: str, reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    """A map field's rules: its keys are valid Kubernetes keys, outside the reserved prefixes."""
    rules: list[Any] = [
        cel(
            f"self.all(k, size(k) <= 316 && k.matches('{METADATA_KEY}'))",
            f"{what} keys must be valid Kubernetes keys ([prefix/]name, name at most 63 characters "
            "of letters, digits, '-', '_' and '.')",
        )
    ]
    if reserved:
        prefixes = " || ".join(f"k.startsWith('{p}')" for p in reserved)
        rules.append(
            cel(
                f"!self.exists(k, {prefixes})",
                f"{what} keys under {', '.join(reserved)} belong to the platform and KubeRay: "
                "use your own prefix",
            )
        )
    return {"x-kubernetes-validations": rules}


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace; the value is never copied into any object."""

    name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] = Field(
        description="Name of the Secret in the LLMTrainingJob's namespace."
    )
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        description="Key within the Secret that holds the value."
    )

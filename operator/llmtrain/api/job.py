"""The LLMTrainingJob resource as a whole: metadata, spec and status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmtrain.api.base import ApiModel, cel
from llmtrain.api.spec import LLMTrainingJobSpec
from llmtrain.api.status import LLMTrainingJobStatus
from llmtrain.constants import GROUP_VERSION, KIND, MAX_NAME_LENGTH

# pydantic (and so the CRD and `llmtrain validate`) sees Literal[<the constant>]; mypy accepts no
# name inside Literal, so it sees str.
if TYPE_CHECKING:
    ApiVersion = str
    Kind = str
else:
    ApiVersion = Literal[GROUP_VERSION]
    Kind = Literal[KIND]

DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(BaseModel):
    """The part of metav1.ObjectMeta the tools read; the rest passes through untouched."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(pattern=DNS1035_LABEL, max_length=MAX_NAME_LENGTH)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class LLMTrainingJob(ApiModel):
    """Train or fine-tune an LLM on a Ray cluster that KubeRay creates for this job."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                    f"metadata.name must be at most {MAX_NAME_LENGTH} characters (KubeRay derives "
                    "pod and service names from it)",
                ),
                cel(
                    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                    "metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', "
                    "starting with a letter",
                ),
            ]
        }
    )

    api_version: ApiVersion = Field(default=GROUP_VERSION, alias="apiVersion")
    kind: Kind = KIND
    metadata: ObjectMeta
    spec: LLMTrainingJobSpec
    status: LLMTrainingJobStatus | None = None

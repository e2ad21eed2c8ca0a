"""checkpoint.pushToHub: upload the finished export to a Hugging Face Hub model repository.

A separate field rather than an `hf://` form of checkpoint.exportTo: the Hub needs its own
credentials (a write token, not spec.objectStorage's keys), a visibility for a repository it may
create, and a branch; exportTo stays a plain object-store URI. Both may be set; each is pushed once.

The token never appears in the spec: it names a Secret key that the renderer turns into a
`secretKeyRef` variable (HUB_TOKEN_ENV) in every Ray container. It is not HF_TOKEN, which
model.hfTokenSecretRef already sets for downloads: the two may be different tokens (read and
write), and one variable cannot hold both. On a cluster the Secret must be listed in the namespace's
llmtrain.dev/allowed-secrets annotation, like every Secret a job references.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from llmtrain.api.base import ApiModel, SecretKeyRef

# The variable the trainer reads the push token from (a secretKeyRef entry on a cluster).
HUB_TOKEN_ENV = "LLMTRAIN_HUB_TOKEN"
# huggingface_hub's own endpoint override; the trainer passes it on explicitly.
HUB_ENDPOINT_ENV = "HF_ENDPOINT"
# namespace/name, each part as the Hub accepts it (letters, digits, '-', '_', '.'; at most 96).
REPO_ID = r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,95}/[A-Za-z0-9][-A-Za-z0-9_.]{0,95}$"
# A git branch name without the forms git refuses ('..', a leading '-' or '/', a trailing '/').
BRANCH = r"^[A-Za-z0-9_][-A-Za-z0-9_./]{0,199}$"


class HubPushSpec(ApiModel):
    """Which Hub repository receives the export, with which token."""

    repo_id: Annotated[str, Field(pattern=REPO_ID)] = Field(
        description="The model repository, namespace/name (e.g. my-org/llama-sft); created if missing."
    )
    token_secret_ref: SecretKeyRef = Field(
        description=f"Secret key holding a Hub token with write access to the repository; injected as "
        f"{HUB_TOKEN_ENV} through secretKeyRef only. The Secret must be listed in the namespace's "
        "llmtrain.dev/allowed-secrets annotation."
    )
    private: bool = Field(
        default=True,
        description="Create the repository private (when it does not exist yet; an existing one keeps "
        "its visibility).",
    )
    revision: Annotated[str, Field(pattern=BRANCH)] | None = Field(
        default=None,
        description="The branch to commit to, created from main if missing; unset: main.",
    )

    def secret_env(self) -> dict[str, SecretKeyRef]:
        """Variable → Secret key: the token the Ray containers get through secretKeyRef."""
        return {HUB_TOKEN_ENV: self.token_secret_ref}

"""spec.objectStorage: how the trainer reaches the s3:// (gs://, az://) URIs of dataset.path,
model.name, resumeFrom.checkpoint and checkpoint.exportTo.

Credentials never appear in the spec: it names a Secret whose keys the renderer turns into
`secretKeyRef` variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), which the trainer's
object-store client (pyarrow's S3 filesystem) reads. On a cluster the Secret must also be listed in
the namespace's llmtrain.dev/allowed-secrets annotation, like every Secret a job references.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from llmtrain.api.base import ApiModel, SecretKeyRef

# An object URI: scheme, a bucket (container) name, an optional key or prefix. s3 is tested against
# a real server; gs and az are pyarrow's GCS and Azure filesystems.
OBJECT_URI = r"^(s3|gs|az)://[a-z0-9][-a-z0-9._]{1,61}[a-z0-9](/[^\s]*)?$"
OBJECT_SCHEMES = ("s3://", "gs://", "az://")
# The same rule as a CEL regex (RE2), for fields that take a path or a URI.
OBJECT_URI_CEL = "^(s3|gs|az)://[a-z0-9][-a-z0-9._]{1,61}[a-z0-9](/\\\\S*)?$"
HTTP_URL = r"^https?://[^\s/?#]+([/?#]\S*)?$"

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
REGION_ENV = "AWS_REGION"


def is_object_uri(value: str | None) -> bool:
    """Whether a path field holds an object-store URI rather than a path on the shared storage."""
    return value is not None and value.startswith(OBJECT_SCHEMES)


class ObjectStorageSpec(ApiModel):
    """Where the S3-compatible store is and which Secret holds its keys."""

    endpoint: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] | None = Field(
        default=None,
        description="The S3 API's URL for a non-AWS store (MinIO, Ceph, versitygw, ...), e.g. "
        "http://s3.storage.svc:7070; defaults to AWS. Injected as AWS_ENDPOINT_URL.",
    )
    region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")] = Field(
        default="us-east-1", description="The store's region; injected as AWS_REGION."
    )
    access_key_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the access key id; injected as AWS_ACCESS_KEY_ID through "
        "secretKeyRef only. The Secret must be listed in the namespace's "
        "llmtrain.dev/allowed-secrets annotation."
    )
    secret_key_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the secret access key; injected as AWS_SECRET_ACCESS_KEY "
        "through secretKeyRef only."
    )

    def secret_env(self) -> dict[str, SecretKeyRef]:
        """Variable → Secret key: the credentials the Ray containers get through secretKeyRef."""
        return {ACCESS_KEY_ENV: self.access_key_secret_ref, SECRET_KEY_ENV: self.secret_key_secret_ref}

    def plain_env(self) -> dict[str, str]:
        """The non-secret settings, as plain variables."""
        env = {REGION_ENV: self.region}
        if self.endpoint:
            env[ENDPOINT_ENV] = self.endpoint
        return env

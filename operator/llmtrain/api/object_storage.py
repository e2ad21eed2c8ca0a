"""spec.objectStorage: how the trainer reaches the s3://, gs:// and az:// URIs of dataset.path,
model.name, resumeFrom.checkpoint and checkpoint.exportTo.

Credentials never appear in the spec: it names Secrets whose keys the renderer turns into
`secretKeyRef` variables (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3, a service-account key
for gs, the account key for az), which the trainer's object-store clients (pyarrow's filesystems)
read. On a cluster each Secret must also be listed in the namespace's llmtrain.dev/allowed-secrets
annotation, like every Secret a job references. All three are tested against real servers
(versitygw, fake-gcs-server, Azurite).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from llmtrain.api.base import ApiModel, SecretKeyRef, cel

# An object URI: scheme, a bucket (container) name, an optional key or prefix.
OBJECT_URI = r"^(s3|gs|az)://[a-z0-9][-a-z0-9._]{1,61}[a-z0-9](/[^\s]*)?$"
OBJECT_SCHEMES = ("s3://", "gs://", "az://")
# The same rule as a CEL regex (RE2), for fields that take a path or a URI.
OBJECT_URI_CEL = "^(s3|gs|az)://[a-z0-9][-a-z0-9._]{1,61}[a-z0-9](/\\\\S*)?$"
HTTP_URL = r"^https?://[^\s/?#]+([/?#]\S*)?$"

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
REGION_ENV = "AWS_REGION"
# gs: the JSON of a service-account key (the trainer writes it to a private file for pyarrow, which
# reads GOOGLE_APPLICATION_CREDENTIALS) and an optional endpoint (a private or emulated GCS).
GCS_CREDENTIALS_ENV = "LLMTRAIN_GCS_CREDENTIALS"
GCS_ENDPOINT_ENV = "LLMTRAIN_GCS_ENDPOINT"
# az: the storage account, its key, and an optional blob endpoint (Azurite, a private endpoint).
AZURE_ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT_NAME"
AZURE_KEY_ENV = "AZURE_STORAGE_ACCOUNT_KEY"
AZURE_ENDPOINT_ENV = "LLMTRAIN_AZURE_ENDPOINT"


def is_object_uri(value: str | None) -> bool:
    """Whether a path field holds an object-store URI rather than a path on the shared storage."""
    return value is not None and value.startswith(OBJECT_SCHEMES)


class GcsSpec(ApiModel):
    """Google Cloud Storage (gs:// URIs): a service-account key in a Secret, and the endpoint."""

    credentials_secret_ref: SecretKeyRef = Field(
        description="Secret key holding a service-account key (the JSON file Google Cloud hands "
        "out); injected as LLMTRAIN_GCS_CREDENTIALS through secretKeyRef only. The Secret must be "
        "listed in the namespace's llmtrain.dev/allowed-secrets annotation."
    )
    endpoint: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] | None = Field(
        default=None,
        description="The GCS JSON API's URL for a private or emulated store, e.g. "
        "http://gcs.storage.svc:4443; defaults to Google's. Injected as LLMTRAIN_GCS_ENDPOINT.",
    )


class AzureSpec(ApiModel):
    """Azure Blob Storage (az://container/key URIs): the account, its key in a Secret, the endpoint."""

    account_name: Annotated[str, Field(pattern=r"^[a-z0-9]{3,24}$")] = Field(
        description="The storage account (3-24 lower-case letters and digits); injected as "
        "AZURE_STORAGE_ACCOUNT_NAME."
    )
    account_key_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the storage account's access key; injected as "
        "AZURE_STORAGE_ACCOUNT_KEY through secretKeyRef only. The Secret must be listed in the "
        "namespace's llmtrain.dev/allowed-secrets annotation."
    )
    endpoint: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] | None = Field(
        default=None,
        description="The blob service's URL for an emulator or private endpoint (Azurite: "
        "http://<IP>:10000, the account then goes into the path); defaults to "
        "https://<account>.blob.core.windows.net. Injected as LLMTRAIN_AZURE_ENDPOINT.",
    )


class ObjectStorageSpec(ApiModel):
    """Where the stores are and which Secrets hold their keys: the S3 fields at this level, gcs
    and azure below."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.accessKeySecretRef) == has(self.secretKeySecretRef)",
                    "objectStorage.accessKeySecretRef and objectStorage.secretKeySecretRef go "
                    "together: set both (or neither, when no s3:// URI is used)",
                    ".accessKeySecretRef",
                )
            ]
        }
    )

    endpoint: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] | None = Field(
        default=None,
        description="The S3 API's URL for a non-AWS store (MinIO, Ceph, versitygw, ...), e.g. "
        "http://s3.storage.svc:7070; defaults to AWS. Injected as AWS_ENDPOINT_URL.",
    )
    region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")] = Field(
        default="us-east-1", description="The S3 store's region; injected as AWS_REGION."
    )
    access_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the S3 access key id (needed by s3:// URIs); injected as "
        "AWS_ACCESS_KEY_ID through secretKeyRef only. The Secret must be listed in the namespace's "
        "llmtrain.dev/allowed-secrets annotation.",
    )
    secret_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the S3 secret access key; injected as AWS_SECRET_ACCESS_KEY "
        "through secretKeyRef only.",
    )
    gcs: GcsSpec | None = Field(
        default=None, description="Google Cloud Storage, for gs:// URIs: the service-account key's Secret."
    )
    azure: AzureSpec | None = Field(
        default=None, description="Azure Blob Storage, for az:// URIs: the account and its key's Secret."
    )

    @property
    def has_s3(self) -> bool:
        """Whether the S3 keys are set (s3:// URIs need them)."""
        return self.access_key_secret_ref is not None

    def secret_env(self) -> dict[str, SecretKeyRef]:
        """Variable → Secret key: the credentials the Ray containers get through secretKeyRef."""
        env: dict[str, SecretKeyRef] = {}
        if self.access_key_secret_ref is not None and self.secret_key_secret_ref is not None:
            env.update(
                {ACCESS_KEY_ENV: self.access_key_secret_ref, SECRET_KEY_ENV: self.secret_key_secret_ref}
            )
        if self.gcs is not None:
            env[GCS_CREDENTIALS_ENV] = self.gcs.credentials_secret_ref
        if self.azure is not None:
            env[AZURE_KEY_ENV] = self.azure.account_key_secret_ref
        return env

    def plain_env(self) -> dict[str, str]:
        """The non-secret settings, as plain variables."""
        env: dict[str, str] = {}
        if self.has_s3 or self.endpoint:
            env[REGION_ENV] = self.region
        if self.endpoint:
            env[ENDPOINT_ENV] = self.endpoint
        if self.gcs is not None and self.gcs.endpoint:
            env[GCS_ENDPOINT_ENV] = self.gcs.endpoint
        if self.azure is not None:
            env[AZURE_ACCOUNT_ENV] = self.azure.account_name
            if self.azure.endpoint:
                env[AZURE_ENDPOINT_ENV] = self.azure.endpoint
        return env

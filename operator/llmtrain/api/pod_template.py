"""`spec.podTemplate`: what the spec does not model but real clusters need on the trainer's pods.

A small overlay, not a whole PodTemplateSpec: private registries (imagePullSecrets), labels and
annotations (sidecar injection, cost allocation, workload identity), annotations on the trainer's
ServiceAccount (IRSA, GKE/Azure workload identity) and extra volumes of the kinds restricted Pod
Security admits. Everything that would break the platform's own wiring (its labels, volumes and
mount paths) is refused at apply time.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from llmtrain.api.base import DNS1123_SUBDOMAIN, LABEL_VALUE, ApiModel, cel, metadata_keys_rule
from llmtrain.constants import API_GROUP, CONFIG_DIR, RAY_API_GROUP

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The pods' own labels: the job and role labels the operator selects on, and KubeRay's.
RESERVED_LABEL_PREFIXES = (f"{API_GROUP}/", f"{RAY_API_GROUP}/")
# Volumes the platform mounts (render/rayjob.py) and the one KubeRay adds for Ray's auth token.
RESERVED_VOLUMES = ("shared-storage", "trainer-config", "dshm", "ray-token")
RESERVED_MOUNT_PATHS = ("/dev/shm", CONFIG_DIR)
# Volume sources restricted Pod Security admits (hostPath and the like are not among them).
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "emptyDir",
    "projected",
    "csi",
    "ephemeral",
    "downwardAPI",
)

Metadata = Annotated[
    dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]], Field(max_length=64)
]
Annotations = Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(max_length=64)]
VolumeSource = dict[str, Any] | None


class LocalObjectReference(ApiModel):
    name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] = Field(
        description="Name of a Secret in the job's namespace."
    )


class ExtraVolume(ApiModel):
    """One volume, with exactly one source (core/v1 Volume fields of that source)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "[" + ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES) + "].filter(x, x).size() == 1",
                    "each podTemplate.volumes entry needs exactly one source: " + ", ".join(VOLUME_SOURCES),
                ),
                cel(
                    "!(self.name in [" + ", ".join(f"'{v}'" for v in RESERVED_VOLUMES) + "])",
                    f"podTemplate.volumes names {', '.join(RESERVED_VOLUMES)} are the platform's: rename it",
                    ".name",
                ),
            ]
        }
    )

    name: Annotated[str, Field(pattern=DNS1123_LABEL, max_length=63)] = Field(description="Volume name.")
    config_map: VolumeSource = Field(default=None, description="core/v1 ConfigMapVolumeSource.")
    secret: VolumeSource = Field(default=None, description="core/v1 SecretVolumeSource.")
    persistent_volume_claim: VolumeSource = Field(
        default=None, description="core/v1 PersistentVolumeClaimVolumeSource."
    )
    empty_dir: VolumeSource = Field(default=None, description="core/v1 EmptyDirVolumeSource.")
    projected: VolumeSource = Field(default=None, description="core/v1 ProjectedVolumeSource.")
    csi: VolumeSource = Field(default=None, description="core/v1 CSIVolumeSource.")
    ephemeral: VolumeSource = Field(default=None, description="core/v1 EphemeralVolumeSource.")
    downward_api: VolumeSource = Field(
        default=None, alias="downwardAPI", description="core/v1 DownwardAPIVolumeSource."
    )


class ExtraVolumeMount(ApiModel):
    """Where a podTemplate volume appears in the Ray containers (head and workers)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(self.mountPath in [" + ", ".join(f"'{p}'" for p in RESERVED_MOUNT_PATHS) + "])"
                    " && !self.mountPath.startsWith('/dev/shm/')"
                    f" && !self.mountPath.startsWith('{CONFIG_DIR}/')",
                    f"podTemplate.volumeMounts cannot use {', '.join(RESERVED_MOUNT_PATHS)}: the "
                    "platform mounts shared memory and the trainer config there",
                    ".mountPath",
                ),
            ]
        }
    )

    name: Annotated[str, Field(pattern=DNS1123_LABEL, max_length=63)] = Field(
        description="Name of a podTemplate.volumes entry."
    )
    mount_path: Annotated[str, Field(pattern=r"^/[^:]*$", max_length=256)] = Field(
        description="Absolute path in the container."
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: Annotated[str, Field(pattern=r"^[^/].*$", max_length=256)] | None = Field(
        default=None, description="A path inside the volume (relative)."
    )


class PodTemplateOverlay(ApiModel):
    """Added to the Ray head, workers and (metadata and pull secrets) the submitter pod."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                    "has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                    "every podTemplate.volumeMounts name must be a podTemplate.volumes entry",
                    ".volumeMounts",
                ),
                cel(
                    "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
                    "podTemplate.volumes names must be unique",
                    ".volumes",
                ),
            ]
        }
    )

    labels: Metadata = Field(
        default_factory=dict,
        description="Labels of the Ray pods (not under llmtrain.dev/ or ray.io/).",
        json_schema_extra=metadata_keys_rule("podTemplate.labels", RESERVED_LABEL_PREFIXES),
    )
    annotations: Annotations = Field(
        default_factory=dict,
        description='Annotations of the Ray pods (e.g. sidecar.istio.io/inject: "false").',
        json_schema_extra=metadata_keys_rule("podTemplate.annotations"),
    )
    service_account_annotations: Annotations = Field(
        default_factory=dict,
        description="Annotations of the trainer's ServiceAccount (e.g. eks.amazonaws.com/role-arn, "
        "iam.gke.io/gcp-service-account for workload identity).",
        json_schema_extra=metadata_keys_rule("podTemplate.serviceAccountAnnotations"),
    )
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] = Field(
        default_factory=list,
        description="Secrets in the job's namespace to pull the trainer image with (added to the "
        "operator's defaults).",
    )
    volumes: Annotated[list[ExtraVolume], Field(max_length=32)] = Field(
        default_factory=list, description="Extra volumes of the Ray head and workers."
    )
    volume_mounts: Annotated[list[ExtraVolumeMount], Field(max_length=32)] = Field(
        default_factory=list, description="Where the extra volumes are mounted in the Ray containers."
    )

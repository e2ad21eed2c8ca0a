"""The shared storage: an existing claim, or a PVC created for the job."""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.render.labels import object_meta
from llmtrain.render.names import pvc_name


def claim_name(job: LLMTrainingJob) -> str:
    storage = job.spec.storage
    return storage.claim_name if storage.claim_name else pvc_name(job.metadata.name)


def render_pvc(job: LLMTrainingJob) -> dict[str, Any] | None:
    create = job.spec.storage.create
    if create is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": list(create.access_modes),
        "resources": {"requests": {"storage": create.size}},
    }
    if create.storage_class_name:
        spec["storageClassName"] = create.storage_class_name
    meta = object_meta(job, pvc_name(job.metadata.name), "storage")
    if create.reclaim == "Retain":
        # No owner: the garbage collector leaves the claim (and the trained model on it) when the
        # job goes. Its labels still mark it as this job's, so a namesake applied later reuses it.
        meta.pop("ownerReferences", None)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}

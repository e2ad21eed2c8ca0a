"""Labels on every child, and the owner reference that ties it to its LLMTrainingJob."""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.constants import (
    GROUP_VERSION,
    JOB_LABEL,
    JOB_UID_LABEL,
    KIND,
    MANAGED_BY_LABEL,
    OPERATOR_NAME,
)


def operator_labels(component: str) -> dict[str, str]:
    """What every object the operator makes carries, a job's child or the namespace's own."""
    return {
        "app.kubernetes.io/name": "llmtrain",
        MANAGED_BY_LABEL: OPERATOR_NAME,
        "app.kubernetes.io/component": component,
    }


def labels(job: LLMTrainingJob, component: str) -> dict[str, str]:
    """The job's uid too, once it has one: which incarnation of the job a child belongs to."""
    out = {
        **operator_labels(component),
        "app.kubernetes.io/instance": job.metadata.name,
        JOB_LABEL: job.metadata.name,
    }
    if job.metadata.uid:
        out[JOB_UID_LABEL] = job.metadata.uid
    return out


def owner_references(job: LLMTrainingJob) -> list[dict[str, Any]]:
    """A controller reference when the job has a uid (it does once stored by the API server)."""
    if not job.metadata.uid:
        return []
    return [
        {
            "apiVersion": GROUP_VERSION,
            "kind": KIND,
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_meta(job: LLMTrainingJob, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": labels(job, component),
    }
    owners = owner_references(job)
    if owners:
        meta["ownerReferences"] = owners
    return meta

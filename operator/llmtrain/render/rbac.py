"""The trainer's own identity: it may patch the status of its own LLMTrainingJob, nothing else."""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.constants import API_GROUP, PLURAL
from llmtrain.render.labels import object_meta
from llmtrain.render.names import trainer_account_name


def trainer_rules(job: LLMTrainingJob) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": [API_GROUP],
            "resources": [f"{PLURAL}/status"],
            "resourceNames": [job.metadata.name],
            "verbs": ["patch"],
        }
    ]


def render_rbac(job: LLMTrainingJob) -> list[dict[str, Any]]:
    name = trainer_account_name(job.metadata.name)
    meta = object_meta(job, name, "trainer-identity")
    account_meta = dict(meta)
    if annotations := job.spec.pod_template.service_account_annotations:
        account_meta["annotations"] = dict(annotations)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": account_meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": trainer_rules(job),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.metadata.namespace}],
        },
    ]

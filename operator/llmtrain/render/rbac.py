"""The trainer's identity and the namespace's reporter rights.

Each job gets its own ServiceAccount (the identity its Ray pods run as). The right to patch a
job's status is granted once per namespace: one Role and RoleBinding (`REPORTER_NAME`) for the
namespace's ServiceAccounts, which the chart's reporter admission policy narrows to the job each
account is named after. A Role and RoleBinding per job cost two RBAC creates on every job's path,
the dearest of its children (README "Per-job RBAC, the alternative").
"""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.constants import API_GROUP, PLURAL, REPORTER_NAME
from llmtrain.render.labels import object_meta, operator_labels
from llmtrain.render.names import trainer_account_name

RBAC_GROUP = "rbac.authorization.k8s.io"


def reporter_rules() -> list[dict[str, Any]]:
    """Patch on the status of the namespace's jobs; which job, the admission policy decides."""
    return [{"apiGroups": [API_GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]}]


def reporter_subject(namespace: str) -> dict[str, Any]:
    """Every ServiceAccount of the namespace, as the group the API server puts them in."""
    return {"kind": "Group", "apiGroup": RBAC_GROUP, "name": f"system:serviceaccounts:{namespace}"}


def render_reporter_rbac(namespace: str) -> list[dict[str, Any]]:
    """The namespace's reporter Role and RoleBinding. No job label and no owner: they serve every
    job of the namespace and outlive each one (deleted with the namespace, or by hand)."""
    meta = {"name": REPORTER_NAME, "namespace": namespace, "labels": operator_labels("reporter")}
    return [
        {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "Role", "metadata": meta, "rules": reporter_rules()},
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": REPORTER_NAME},
            "subjects": [reporter_subject(namespace)],
        },
    ]


def render_rbac(job: LLMTrainingJob) -> list[dict[str, Any]]:
    """The job's ServiceAccount: its trainer's identity (the status right is the namespace's)."""
    meta = object_meta(job, trainer_account_name(job.metadata.name), "trainer-identity")
    if annotations := job.spec.pod_template.service_account_annotations:
        meta["annotations"] = dict(annotations)
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}]

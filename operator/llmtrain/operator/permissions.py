"""Every API call the operator makes, declared once.

The Helm chart's RBAC is generated from this list (`make generate` writes it into the chart) and a
test checks that the operator's recorded calls against the test API server stay inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.api.spec import API_GROUP, PLURAL


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]

    def rule(self) -> dict[str, list[str]]:
        return {"apiGroups": [self.api_group], "resources": [self.resource], "verbs": list(self.verbs)}


OPERATOR_PERMISSIONS: tuple[Permission, ...] = (
    # Kopf lists and watches the jobs; its bookkeeping goes to status (no annotations, no
    # finalizers), so the main resource is never written.
    Permission(API_GROUP, PLURAL, ("get", "list", "watch")),
    Permission(API_GROUP, f"{PLURAL}/status", ("patch",)),
    # Never called: the OwnerReferencesPermissionEnforcement admission plugin lets a client set
    # blockOwnerDeletion on a child only if it may update the owner's finalizers.
    Permission(API_GROUP, f"{PLURAL}/finalizers", ("update",)),
    # The RayJob: created, adopted, kept in sync (suspend, deadlines), watched for status.
    Permission("ray.io", "rayjobs", ("get", "list", "watch", "create", "patch")),
    # Children rendered per job.
    Permission("", "configmaps", ("get", "create", "patch")),
    Permission("", "persistentvolumeclaims", ("get", "create")),
    Permission("", "serviceaccounts", ("get", "create", "patch")),
    Permission("rbac.authorization.k8s.io", "roles", ("get", "create", "patch")),
    Permission("rbac.authorization.k8s.io", "rolebindings", ("get", "create", "patch")),
    # Kubernetes Events on phase transitions and errors.
    Permission("", "events", ("create",)),
    Permission("events.k8s.io", "events", ("create",)),
)


def granted(api_group: str, resource: str, verb: str) -> bool:
    return any(
        p.api_group == api_group and p.resource == resource and verb in p.verbs for p in OPERATOR_PERMISSIONS
    )

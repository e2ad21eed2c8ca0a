"""Every API call the operator makes, declared once, and the rights admission checks demand.

The Helm chart's RBAC is generated from this list (`make generate` writes it into the chart). The
cluster tier reads the real API server's audit log: every request the operator made is a declared
call, every declared call is made by some scenario, and no `admission_only` verb is ever called.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.constants import (
    API_GROUP,
    KUEUE_GROUP,
    KUEUE_WORKLOAD_PLURAL,
    PLURAL,
    RAY_API_GROUP,
    RAYJOB_PLURAL,
)


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    # Granted, never called: an admission plugin demands them for a call in `verbs`.
    admission_only: tuple[str, ...] = ()

    def rule(self) -> dict[str, list[str]]:
        verbs = [*self.verbs, *self.admission_only]
        return {"apiGroups": [self.api_group], "resources": [self.resource], "verbs": verbs}


# OwnerReferencesPermissionEnforcement (on in OpenShift and hardened clusters; kube-apiserver's
# plugin/pkg/admission/gc) judges only writes that change ownerReferences. A create may set them
# freely; an update or patch that changes them needs `delete` on that very object. Setting
# blockOwnerDeletion (on create too) needs `update` on the owner's `finalizers`. The operator changes
# the owner references of an existing object in one case only: it adopts the claim an earlier job of
# the name left behind (`kubectl delete --cascade=orphan` keeps the data), so `delete` is granted on
# claims alone (children.ADOPTED_KINDS); the containment policy refuses every real DELETE.
ADOPT = ("delete",)


OPERATOR_PERMISSIONS: tuple[Permission, ...] = (
    # Kopf's resource scanning (cluster-wide installs): a CRD added after the operator started is
    # noticed and its resources served (operator/settings.py). Read-only.
    Permission("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    # Kopf lists and watches the jobs; its bookkeeping goes to status (no annotations, no
    # finalizers). The main resource is patched for one thing: the `llmtrain.dev/finished` label
    # on a finished job, which keeps it out of Kopf's watch and the resync's lists
    # (reporting.mark_finished).
    Permission(API_GROUP, PLURAL, ("get", "list", "watch", "patch")),
    Permission(API_GROUP, f"{PLURAL}/status", ("patch",)),
    Permission(API_GROUP, f"{PLURAL}/finalizers", (), admission_only=("update",)),
    # The RayJob: created, adopted, kept in sync (suspend, deadlines), watched for status.
    Permission(RAY_API_GROUP, RAYJOB_PLURAL, ("get", "list", "watch", "create", "patch")),
    # Children rendered per job: created, or re-synced; a claim may also be adopted (owner
    # reference patched in).
    Permission("", "configmaps", ("get", "create", "patch")),
    Permission("", "persistentvolumeclaims", ("get", "create", "patch"), ADOPT),
    Permission("", "serviceaccounts", ("get", "create", "patch")),
    Permission("rbac.authorization.k8s.io", "roles", ("get", "create", "patch")),
    Permission("rbac.authorization.k8s.io", "rolebindings", ("get", "create", "patch")),
    # A queued job's runPolicy.suspend: its Kueue Workload (de)activated, found by the RayJob's uid.
    Permission(KUEUE_GROUP, KUEUE_WORKLOAD_PLURAL, ("list", "patch")),
    # Kubernetes Events on phase transitions and errors; a starting job's Warning Events (and its
    # Ray pods and, for an unschedulable pod, the nodes) are read to name what blocks it
    # (operator/startup.py). Read-only; a watchNamespaces install cannot read nodes (no
    # cluster-wide rights) and quotes the scheduler instead.
    Permission("", "events", ("create", "list")),
    Permission("", "pods", ("list",)),
    Permission("", "nodes", ("list",)),
    Permission("events.k8s.io", "events", ("create",)),
)


# Leader election (`--leader-elect`): one Lease, in the operator's own namespace only (a Role there).
ELECTION_PERMISSIONS: tuple[Permission, ...] = (
    Permission("coordination.k8s.io", "leases", ("get", "create", "update")),
)


def granted(api_group: str, resource: str, verb: str) -> bool:
    return any(
        p.api_group == api_group and p.resource == resource and verb in p.verbs
        for p in (*OPERATOR_PERMISSIONS, *ELECTION_PERMISSIONS)
    )

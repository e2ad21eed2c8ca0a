"""The containment policy (templates/admission-policy.yaml) against what the operator renders, offline.

Its CEL runs here in the project's CEL engine, as the API server runs it (variables first, then
every validation), on requests made of rendered children: whatever the renderer produces must be
admitted, so a change to the renderer that the policy would refuse fails here, in `make test-fast`,
before the cluster tier (tests/cluster/test_containment.py) meets it. `substring`, `split`, `trim`
and `join` (Kubernetes CEL string extensions) are supplied, the rest is standard CEL.
"""

from __future__ import annotations

import copy
from typing import Any

import cel
import pytest
from llmtrain.api.validation import parse_job
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION, SUSPENDED_BY_USER_ANNOTATION
from llmtrain.render import render
from llmtrain.render.rbac import render_reporter_rbac

from tests.chart.helm import NAMESPACE, find, one, render_set
from tests.chart.helm import render as render_chart
from tests.support.jobs import minimal_job

Obj = dict[str, Any]
RESOURCES = {
    "ConfigMap": ("", "configmaps"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "RayJob": ("ray.io", "rayjobs"),
    "Workload": ("kueue.x-k8s.io", "workloads"),
}
# The namespace every rendered child goes to lists the Secrets the JOBS below reference.
ALLOWED = "hf, s, wandb"


def policy(value_set: str = "default") -> Obj:
    """The containment policy, named after the operator (the chart's other one is the reporter's)."""
    return one(render_set(value_set), "ValidatingAdmissionPolicy", "llmtrain-operator")


def _context(bindings: dict[str, Any]) -> cel.Context:
    context = cel.Context(bindings)
    context.add_function("substring", lambda s, start, end: s[start:end])
    context.add_function("split", lambda s, sep: s.split(sep))
    context.add_function("trim", lambda s: s.strip())
    context.add_function("join", lambda items, sep: sep.join(items))
    return context


def _run(expression: str, bindings: dict[str, Any]) -> Any:
    return cel.compile(expression).execute(_context(bindings))


def operator_user(spec: Obj) -> str:
    (condition,) = spec["matchConditions"]
    prefix = "request.userInfo.username == '"
    expression: str = condition["expression"]
    assert expression.startswith(prefix) and expression.endswith("'"), expression
    return expression[len(prefix) : -1]


def judge(
    spec: Obj, operation: str, obj: Obj | None, old: Obj | None = None, allowed: str | None = ALLOWED
) -> list[str]:
    """The messages of the validations that refuse the request (an evaluation error refuses too:
    the policy's failurePolicy is Fail). `allowed`: the namespace's allowed-secrets annotation
    (None: it has none)."""
    target = obj or old
    assert target is not None
    group, resource = RESOURCES[target["kind"]]
    request = {
        "operation": operation,
        "kind": {"group": group, "version": target["apiVersion"].split("/")[-1], "kind": target["kind"]},
        "resource": {"group": group, "version": target["apiVersion"].split("/")[-1], "resource": resource},
        "namespace": target["metadata"]["namespace"],
        "name": target["metadata"]["name"],
        "userInfo": {"username": operator_user(spec)},
    }
    annotations = {ALLOWED_SECRETS_ANNOTATION: allowed} if allowed is not None else {}
    namespace = {"metadata": {"name": request["namespace"], "annotations": annotations}}
    bindings: dict[str, Any] = {
        "request": request,
        "object": obj,
        "oldObject": old,
        "namespaceObject": namespace,
    }
    assert all(_run(c["expression"], bindings) is True for c in spec["matchConditions"])
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        try:  # the API server evaluates variables lazily: one that fails matters only where used
            variables[variable["name"]] = _run(variable["expression"], {**bindings, "variables": variables})
        except Exception:
            continue
    bindings["variables"] = variables
    refused = []
    for validation in spec["validations"]:
        try:
            allowed = _run(validation["expression"], bindings) is True
        except Exception:
            allowed = False
        if not allowed:
            try:
                refused.append(str(_run(validation["messageExpression"], bindings)))
            except Exception:
                refused.append(validation["expression"])
    return refused


def rendered(name: str, namespace: str = "team-a", **spec: Any) -> list[Obj]:
    job = parse_job(minimal_job(name, namespace, **spec))
    return render(job)


JOBS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "name-hashed-for-every-child": {"name": "a-job-whose-name-is-long-enough-to-hash-its-kid"},
    "queued": {"runPolicy": {"queueName": "team-queue"}},
    "hf-token-and-placement": {
        "model": {"name": "meta-llama/Llama-3.1-8B", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
        "resources": {
            "workers": 2,
            "gpusPerWorker": 8,
            "nodeSelector": {"pool": "gpu"},
            "priorityClassName": "training",
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        },
    },
    "created-claim": {"storage": {"create": {"size": "1Gi", "storageClassName": "shared-rwx"}}},
    # The fabric profiles' workers request their device; with ipcLock they add IPC_LOCK.
    "infiniband-fabric": {
        "resources": {"gpusPerWorker": 8},
        "network": {"ncclProfile": "infiniband", "fabric": {"ipcLock": True}},
    },
    "efa-fabric-default": {"resources": {"gpusPerWorker": 8}, "network": {"ncclProfile": "efa"}},
    "efa-fabric-named-device": {
        "resources": {"gpusPerWorker": 8, "gpuResourceName": "nvidia.com/mig-3g.40gb"},
        "network": {"ncclProfile": "efa", "fabric": {"resourceName": "example.com/efa", "perWorker": 4}},
    },
    "queued-and-suspended": {"runPolicy": {"queueName": "team-queue", "suspend": True}},
    # Every volume kind spec.podTemplate may add, with pull secrets, labels and annotations.
    "pod-template-overlay": {
        "podTemplate": {
            "labels": {"team": "nlp"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/t"},
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "a", "configMap": {"name": "c"}},
                {"name": "b", "secret": {"secretName": "s"}},
                {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "d", "emptyDir": {}},
                {"name": "e", "projected": {"sources": []}},
                {"name": "f", "csi": {"driver": "example.csi"}},
                {"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "h", "downwardAPI": {"items": []}},
            ],
            "volumeMounts": [{"name": "b", "mountPath": "/secrets", "readOnly": True}],
        }
    },
}


@pytest.mark.parametrize("case", JOBS, ids=list(JOBS))
def test_every_child_the_operator_renders_is_admitted(case: str) -> None:
    spec = policy()["spec"]
    overrides = dict(JOBS[case])
    name = overrides.pop("name", "train")
    try:
        children = rendered(name, **overrides)
    except Exception as err:  # a spec the API no longer takes: the case must be updated
        raise AssertionError(f"{case}: {err}") from err
    for child in children:
        assert judge(spec, "CREATE", child) == [], f"{case}: {child['kind']}/{child['metadata']['name']}"
        # Re-sync and adoption: the same object patched back (its labels put back on an orphan).
        assert judge(spec, "UPDATE", child, copy.deepcopy(child)) == [], child["kind"]


def test_a_bound_claim_is_adopted_but_never_rebound() -> None:
    """The binder sets spec.volumeName on a claim; adopting it patches a claim that carries one."""
    spec = policy()["spec"]
    (claim,) = [c for c in rendered("train", **JOBS["created-claim"]) if c["kind"] == "PersistentVolumeClaim"]
    bound = copy.deepcopy(claim)
    bound["spec"]["volumeName"] = "pvc-1234"
    assert judge(spec, "UPDATE", bound, copy.deepcopy(bound)) == []
    assert "never binds a claim" in judge(spec, "UPDATE", bound, claim)[0]
    rebound = copy.deepcopy(bound)
    rebound["spec"]["volumeName"] = "someone-elses"
    assert "never binds a claim" in judge(spec, "UPDATE", rebound, bound)[0]
    assert "never binds a claim" in judge(spec, "CREATE", bound)[0]


def test_the_operator_is_refused_what_it_never_renders() -> None:
    """A few of the cluster tier's refusals, to show this evaluation is not vacuous."""
    spec = policy()["spec"]
    children = {c["kind"]: c for c in rendered("train")}
    unlabelled = copy.deepcopy(children["ConfigMap"])
    del unlabelled["metadata"]["labels"]
    assert "the operator writes only objects labelled" in judge(spec, "CREATE", unlabelled)[0]
    assert "the operator never deletes" in judge(spec, "DELETE", None, children["ConfigMap"])[0]
    assert "it is not the operator's" in judge(spec, "UPDATE", children["ConfigMap"], unlabelled)[0]
    # ... unless a job controls it: the operator puts back the labels someone removed.
    owned = copy.deepcopy(unlabelled)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "llmtrain.dev/v1alpha1",
            "kind": "LLMTrainingJob",
            "name": "train",
            "uid": "1",
            "controller": True,
        }
    ]
    assert judge(spec, "UPDATE", children["ConfigMap"], owned) == []
    role = copy.deepcopy(_legacy_trainer_role())
    role["rules"][0]["verbs"] = ["patch", "update"]
    assert "the only Role the operator writes" in judge(spec, "CREATE", role)[0]
    rayjob = copy.deepcopy(children["RayJob"])
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    assert (
        "may mount only the volume kinds restricted Pod Security admits" in judge(spec, "CREATE", rayjob)[0]
    )
    rayjob = copy.deepcopy(children["RayJob"])
    rayjob["spec"]["submitterPodTemplate"]["spec"]["serviceAccountName"] = "admin"
    assert "trainer ServiceAccount" in judge(spec, "CREATE", rayjob)[0]


def _legacy_trainer_role() -> Obj:
    """The per-job trainer Role earlier operators made (patch on its own job's status)."""
    (account,) = [c for c in rendered("train") if c["kind"] == "ServiceAccount"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": copy.deepcopy(account["metadata"]),
        "rules": [
            {
                "apiGroups": ["llmtrain.dev"],
                "resources": ["llmtrainingjobs/status"],
                "resourceNames": ["train"],
                "verbs": ["patch"],
            }
        ],
    }


def test_the_namespace_reporter_role_and_binding_are_admitted_created_and_put_back() -> None:
    spec = policy()["spec"]
    for obj in render_reporter_rbac("team-a"):
        assert judge(spec, "CREATE", obj) == [], obj["kind"]
        assert judge(spec, "UPDATE", obj, copy.deepcopy(obj)) == [], obj["kind"]
        edited = copy.deepcopy(obj)  # edited by hand: the operator puts it back
        edited.pop("rules", None)
        edited["subjects"] = edited.get("subjects", [])[:0]
        assert judge(spec, "UPDATE", obj, edited) == [], obj["kind"]
    # An earlier operator's per-job trainer Role is still one it may keep in sync.
    assert judge(spec, "UPDATE", _legacy_trainer_role(), _legacy_trainer_role()) == []


WIDER = {
    "every job's spec": {"resources": ["llmtrainingjobs"]},
    "another verb": {"verbs": ["patch", "update"]},
    "another group": {"apiGroups": ["llmtrain.dev", ""]},
    "named jobs": {"resourceNames": ["train"]},
}


@pytest.mark.parametrize("change", WIDER, ids=list(WIDER))
def test_a_reporter_role_granting_anything_else_is_refused(change: str) -> None:
    role, _ = render_reporter_rbac("team-a")
    role["rules"][0].update(WIDER[change])
    assert (
        "the reporter Role grants patch on llmtrainingjobs/status"
        in judge(policy()["spec"], "CREATE", role)[0]
    )
    extra = render_reporter_rbac("team-a")[0]
    extra["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    assert judge(policy()["spec"], "CREATE", extra)


BINDINGS = {
    "another namespace's accounts": {"name": "system:serviceaccounts:team-b"},
    "every account": {"name": "system:serviceaccounts"},
    "a user": {"kind": "User", "name": "alice"},
}


@pytest.mark.parametrize("change", BINDINGS, ids=list(BINDINGS))
def test_a_reporter_binding_to_anyone_else_is_refused(change: str) -> None:
    _, binding = render_reporter_rbac("team-a")
    binding["subjects"][0].update(BINDINGS[change])
    assert (
        "the reporter RoleBinding binds the Role llmtrain-reporter"
        in judge(policy()["spec"], "CREATE", binding)[0]
    )
    cluster_role = render_reporter_rbac("team-a")[1]
    cluster_role["roleRef"]["kind"] = "ClusterRole"
    assert judge(policy()["spec"], "CREATE", cluster_role)


def test_no_other_role_passes_as_the_reporter() -> None:
    """Only the one name, labelled as the operator's and with no job label."""
    spec = policy()["spec"]
    role, _ = render_reporter_rbac("team-a")
    renamed = copy.deepcopy(role)
    renamed["metadata"]["name"] = "llmtrain-reporter-2"
    assert "the operator writes only objects labelled" in judge(spec, "CREATE", renamed)[0]
    with_job = copy.deepcopy(role)
    with_job["metadata"]["labels"]["llmtrain.dev/job"] = "train"
    assert "a child of job train is named" in judge(spec, "CREATE", with_job)[0]
    foreign = copy.deepcopy(role)
    del foreign["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert "it is not the operator's" in judge(spec, "UPDATE", role, foreign)[0]


def test_the_policy_matches_the_operators_service_account_only() -> None:
    assert operator_user(policy()["spec"]) == f"system:serviceaccount:{NAMESPACE}:llmtrain-operator"
    assert (
        operator_user(policy("existing-serviceaccount")["spec"])
        == f"system:serviceaccount:{NAMESPACE}:platform-llmtrain-operator"
    )
    objects = render_set("default")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "llmtrain-operator")
    assert binding["spec"] == {"policyName": policy()["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy()["spec"]["failurePolicy"] == "Fail"


def test_the_policy_can_be_switched_off() -> None:
    objects = render_chart({"containment": {"enabled": False}})
    # The reporter policy stays: it confines the trainers, not the operator.
    assert [p["metadata"]["name"] for p in find(objects, "ValidatingAdmissionPolicy")] == [
        "llmtrain-reporter"
    ]
    assert [b["metadata"]["name"] for b in find(objects, "ValidatingAdmissionPolicyBinding")] == [
        "llmtrain-reporter"
    ]


FABRIC_JOB = JOBS["infiniband-fabric"]
CAPABILITIES = "its pods add no capabilities, except IPC_LOCK alone on a worker container"


def _fabric_rayjob() -> Obj:
    (rayjob,) = [c for c in rendered("train", **FABRIC_JOB) if c["kind"] == "RayJob"]
    return rayjob


def _containers(rayjob: Obj, group: str) -> list[Obj]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod = {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rayjob["spec"]["submitterPodTemplate"]["spec"],
    }[group]
    containers: list[Obj] = pod["containers"]
    return containers


def _add(container: Obj, *capabilities: str) -> None:
    container["securityContext"] = copy.deepcopy(container["securityContext"])
    container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": list(capabilities)}


def test_a_fabric_worker_may_add_ipc_lock_and_nothing_else() -> None:
    spec = policy()["spec"]
    rayjob = _fabric_rayjob()
    (worker,) = _containers(rayjob, "worker")
    assert worker["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert judge(spec, "CREATE", rayjob) == []
    refusals: dict[str, Any] = {
        "IPC_LOCK and NET_RAW on the worker": lambda r: _add(
            _containers(r, "worker")[0], "IPC_LOCK", "NET_RAW"
        ),
        "SYS_ADMIN on the worker": lambda r: _add(_containers(r, "worker")[0], "SYS_ADMIN"),
        "IPC_LOCK on the head": lambda r: _add(_containers(r, "head")[0], "IPC_LOCK"),
        "IPC_LOCK on the submitter": lambda r: _add(_containers(r, "submitter")[0], "IPC_LOCK"),
        "IPC_LOCK on a worker without a fabric device": lambda r: _containers(r, "worker")[0]["resources"][
            "limits"
        ].pop("rdma/rdma_shared_device_a"),
        "IPC_LOCK on a worker init container": lambda r: r["spec"]["rayClusterSpec"]["workerGroupSpecs"][0][
            "template"
        ]["spec"].__setitem__("initContainers", [copy.deepcopy(_containers(r, "worker")[0])]),
    }
    for what, change in refusals.items():
        changed = copy.deepcopy(rayjob)
        change(changed)
        refused = judge(spec, "CREATE", changed)
        assert any(CAPABILITIES in m for m in refused), f"{what}: {refused}"


def test_a_restricted_profile_worker_may_not_add_ipc_lock() -> None:
    """Only a worker requesting a fabric device: with just a GPU, IPC_LOCK is refused."""
    spec = policy()["spec"]
    (rayjob,) = [c for c in rendered("train", resources={"gpusPerWorker": 8}) if c["kind"] == "RayJob"]
    assert judge(spec, "CREATE", rayjob) == []
    _add(_containers(rayjob, "worker")[0], "IPC_LOCK")
    assert any(CAPABILITIES in m for m in judge(spec, "CREATE", rayjob))


RESTRICTED = "its pods must be"


def _pod(rayjob: Obj, group: str) -> Obj:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod: Obj = {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rayjob["spec"]["submitterPodTemplate"]["spec"],
    }[group]
    return pod


def _container_context(pod: Obj) -> Obj:
    context: Obj = pod["containers"][0].setdefault("securityContext", {})
    return context


# Each clause of podsAreRestricted, broken once: a compromised operator could otherwise start a pod
# that escapes to its node.
ESCAPES: dict[str, Any] = {
    "hostNetwork": lambda p: p.__setitem__("hostNetwork", True),
    "hostPID": lambda p: p.__setitem__("hostPID", True),
    "hostIPC": lambda p: p.__setitem__("hostIPC", True),
    "hostPort": lambda p: p["containers"][0].__setitem__("ports", [{"containerPort": 80, "hostPort": 80}]),
    "pod runAsUser 0": lambda p: p["securityContext"].__setitem__("runAsUser", 0),
    "pod runAsNonRoot false": lambda p: p["securityContext"].__setitem__("runAsNonRoot", False),
    "pod without runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
    "container runAsUser 0": lambda p: _container_context(p).__setitem__("runAsUser", 0),
    "allowPrivilegeEscalation true": lambda p: _container_context(p).__setitem__(
        "allowPrivilegeEscalation", True
    ),
    "allowPrivilegeEscalation unset": lambda p: _container_context(p).pop("allowPrivilegeEscalation"),
    "privileged": lambda p: _container_context(p).__setitem__("privileged", True),
}


@pytest.mark.parametrize("group", ["head", "worker", "submitter"])
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_every_pod_security_clause_refuses_its_escape(escape: str, group: str) -> None:
    spec = policy()["spec"]
    (rayjob,) = [copy.deepcopy(c) for c in rendered("train") if c["kind"] == "RayJob"]
    assert judge(spec, "CREATE", rayjob) == []
    ESCAPES[escape](_pod(rayjob, group))
    refused = judge(spec, "CREATE", rayjob)
    assert any(RESTRICTED in m for m in refused), f"{escape} on the {group}: {refused}"


def test_an_init_container_is_held_to_the_same_clauses() -> None:
    spec = policy()["spec"]
    (rayjob,) = [copy.deepcopy(c) for c in rendered("train") if c["kind"] == "RayJob"]
    worker = _pod(rayjob, "worker")
    init = copy.deepcopy(worker["containers"][0])
    init["name"] = "init"
    init["securityContext"]["privileged"] = True
    worker["initContainers"] = [init]
    assert any(RESTRICTED in m for m in judge(spec, "CREATE", rayjob))


# ------------------------------------------------------------------------- Secrets the pods reference

SECRETS = "its pods may reference only the Secrets that namespace"


def _secret_rayjob() -> Obj:
    (rayjob,) = [copy.deepcopy(c) for c in rendered("train") if c["kind"] == "RayJob"]
    return rayjob


# Each way a pod can name a Secret whose data reaches it, naming `name`.
REFERENCES: dict[str, Any] = {
    "secret volume": lambda p, n: p.setdefault("volumes", []).append(
        {"name": "x", "secret": {"secretName": n}}
    ),
    "projected volume": lambda p, n: p.setdefault("volumes", []).append(
        {"name": "x", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": n}}]}}
    ),
    "csi nodePublishSecretRef": lambda p, n: p.setdefault("volumes", []).append(
        {"name": "x", "csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": n}}}
    ),
    "env secretKeyRef": lambda p, n: p["containers"][0]["env"].append(
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}}
    ),
    "envFrom secretRef": lambda p, n: p["containers"][0].__setitem__("envFrom", [{"secretRef": {"name": n}}]),
    "init container env": lambda p, n: p.__setitem__(
        "initContainers",
        [
            {
                "name": "i",
                "image": "i",
                "securityContext": {"allowPrivilegeEscalation": False},
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}}],
            }
        ],
    ),
}


@pytest.mark.parametrize("group", ["head", "worker", "submitter"])
@pytest.mark.parametrize("reference", sorted(REFERENCES))
def test_a_pod_may_reference_only_the_secrets_its_namespace_lists(reference: str, group: str) -> None:
    spec = policy()["spec"]
    rayjob = _secret_rayjob()
    pod = _pod(rayjob, group)
    pod["containers"][0].setdefault("env", [])
    REFERENCES[reference](pod, "wandb")
    assert judge(spec, "CREATE", rayjob) == [], "a listed Secret"
    assert judge(spec, "CREATE", rayjob, allowed="*") == [], "any Secret of the namespace"
    for allowed in ("hf, s", None, ""):
        refused = judge(spec, "CREATE", rayjob, allowed=allowed)
        assert any(SECRETS in m for m in refused), f"{reference} on the {group}, {allowed!r}: {refused}"


def test_the_refusal_names_the_annotation_and_its_list() -> None:
    rayjob = _secret_rayjob()
    REFERENCES["secret volume"](_pod(rayjob, "head"), "argocd-cluster")
    (message,) = judge(policy()["spec"], "CREATE", rayjob, allowed=" hf ,s")
    assert f"namespace team-a lists in its annotation {ALLOWED_SECRETS_ANNOTATION} (now: hf, s)" in message
    (message,) = judge(policy()["spec"], "CREATE", rayjob, allowed=None)
    assert "(now: none)" in message


def test_a_running_jobs_rayjob_is_patched_after_its_namespace_list_shrank() -> None:
    """The user's suspend reaches the RayJob; a patch that adds a reference is judged."""
    spec = policy()["spec"]
    (rayjob,) = [c for c in rendered("train", **JOBS["hf-token-and-placement"]) if c["kind"] == "RayJob"]
    suspended = copy.deepcopy(rayjob)
    suspended["spec"]["suspend"] = True
    assert any(SECRETS in m for m in judge(spec, "CREATE", rayjob, allowed=None))
    assert judge(spec, "UPDATE", suspended, rayjob, allowed=None) == []
    widened = copy.deepcopy(suspended)
    REFERENCES["secret volume"](_pod(widened, "worker"), "kube-root")
    assert any(SECRETS in m for m in judge(spec, "UPDATE", widened, rayjob, allowed="hf"))


# ------------------------------------------------------------------------------------ Kueue Workloads

WORKLOAD = "the operator only (de)activates the Workload of a RayJob"


def _workload() -> Obj:
    """A Workload as Kueue makes it for a RayJob (the fields that matter here)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "rayjob-train-1a2b3",
            "namespace": "team-a",
            "labels": {"kueue.x-k8s.io/job-uid": "u1"},
            "annotations": {"kueue.x-k8s.io/other": "x"},
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJob",
                    "name": "train",
                    "uid": "u1",
                    "controller": True,
                }
            ],
            "finalizers": ["kueue.x-k8s.io/resource-in-use"],
        },
        "spec": {
            "active": True,
            "queueName": "team-queue",
            "podSets": [{"name": "head", "count": 1}],
            "priority": 0,
        },
    }


def _set_active(workload: Obj, active: bool) -> Obj:
    """What operator/workload.py's merge patch makes of it."""
    out = copy.deepcopy(workload)
    out["spec"]["active"] = active
    if active:
        out["metadata"]["annotations"].pop(SUSPENDED_BY_USER_ANNOTATION, None)
    else:
        out["metadata"]["annotations"][SUSPENDED_BY_USER_ANNOTATION] = "true"
    return out


def test_the_operator_may_deactivate_and_reactivate_a_rayjobs_workload() -> None:
    spec = policy()["spec"]
    active = _workload()
    inactive = _set_active(active, False)
    assert judge(spec, "UPDATE", inactive, active) == []
    assert judge(spec, "UPDATE", _set_active(inactive, True), inactive) == []


WORKLOAD_CHANGES: dict[str, Any] = {
    "queue": lambda w: w["spec"].__setitem__("queueName", "someone-elses"),
    "podSets": lambda w: w["spec"]["podSets"][0].__setitem__("count", 64),
    "priority dropped": lambda w: w["spec"].pop("priority"),
    "priority": lambda w: w["spec"].__setitem__("priority", 1000000),
    "label": lambda w: w["metadata"]["labels"].__setitem__("kueue.x-k8s.io/job-uid", "u2"),
    "owner": lambda w: w["metadata"].__setitem__("ownerReferences", []),
    "finalizer": lambda w: w["metadata"].__setitem__("finalizers", []),
    "another annotation": lambda w: w["metadata"]["annotations"].__setitem__("kueue.x-k8s.io/other", "y"),
    "mark other than true": lambda w: w["metadata"]["annotations"].__setitem__(
        SUSPENDED_BY_USER_ANNOTATION, "x"
    ),
}


@pytest.mark.parametrize("change", sorted(WORKLOAD_CHANGES))
def test_a_workload_change_beyond_active_is_refused(change: str) -> None:
    spec = policy()["spec"]
    active = _workload()
    changed = _set_active(active, False)
    WORKLOAD_CHANGES[change](changed)
    assert any(WORKLOAD in m for m in judge(spec, "UPDATE", changed, active)), change


def test_only_a_rayjobs_workload_is_touched_and_none_made_or_deleted() -> None:
    spec = policy()["spec"]
    theirs = _workload()
    theirs["metadata"]["ownerReferences"][0].update(apiVersion="batch/v1", kind="Job")
    assert any(WORKLOAD in m for m in judge(spec, "UPDATE", _set_active(theirs, False), theirs))
    assert any(WORKLOAD in m for m in judge(spec, "CREATE", _workload()))
    assert any("never deletes" in m for m in judge(spec, "DELETE", None, _workload()))

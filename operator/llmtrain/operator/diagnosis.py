"""Pure: why a job's Ray cluster has not started, from its pods, the Warning Events about them and
its RayCluster, and the nodes (`diagnose`); and whether its start-up deadline has passed
(`startup_expired`). `operator/startup.py` reads the inputs and acts on the answer.

Each cause names what to fix and, where the API says, the numbers: the GPUs a pod requests against
what the nodes it may run on can allocate, the image that cannot be pulled, the Secret or
ConfigMap that is missing, the quota that refused a pod. The sources are what the kubelet, the
scheduler, and KubeRay write: a container's waiting reason (ErrImagePull, ImagePullBackOff,
CreateContainerConfigError), the pod's PodScheduled condition (Unschedulable), FailedMount Events,
and KubeRay's FailedToCreate*Pod Events on the RayCluster (a ResourceQuota's refusal).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmtrain.constants import ROLE_LABEL

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons of a container that is merely starting: no cause.
_STARTING = frozenset({"ContainerCreating", "PodInitializing", ""})
_MISSING = re.compile(r'\b(secret|configmap)s? "([^"]+)" not found', re.IGNORECASE)
_MISSING_KEY = re.compile(r"couldn't find key (\S+) in (Secret|ConfigMap) ([^\s/]+)/(\S+)", re.IGNORECASE)
_INSUFFICIENT = re.compile(r"Insufficient (\S+?)[,.]?(?:\s|$)")
# KubeRay's Events when the API refuses one of the cluster's pods.
_CREATE_FAILED = frozenset({"FailedToCreateHeadPod", "FailedToCreateWorkerPod", "FailedCreate"})
# Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
_REPELLING = frozenset({"NoSchedule", "NoExecute"})
# The phases a RayJob's attempt is starting in (KubeRay's jobDeploymentStatus).
STARTING_DEPLOYMENT = frozenset({"Initializing", "Waiting"})
KUBERAY_EXPIRY = "PreRunningDeadlineExceeded"


@dataclass(frozen=True)
class Diagnosis:
    """Why the job waits: a CamelCase `reason` (the condition's and Event's) and a message."""

    reason: str
    message: str


@dataclass(frozen=True)
class _Cause:
    reason: str
    detail: str  # without the pod's name, so pods with the same trouble are counted together
    pod: str


def diagnose(
    pods: Sequence[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] | None,
    cluster_name: str | None = None,
) -> Diagnosis | None:
    """The causes found, the most common first; None when nothing is wrong yet (pods are being
    pulled or started). `events`: Warning Events of the namespace (only those about these pods or
    the RayCluster `cluster_name` are read). `nodes`: None when the operator may not read nodes;
    the scheduler's own words stand in then."""
    events = list(events)
    by_uid: dict[str, list[Mapping[str, Any]]] = {}
    cluster_events: list[Mapping[str, Any]] = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") == "RayCluster" and cluster_name and involved.get("name") == cluster_name:
            cluster_events.append(event)
        elif involved.get("uid"):
            by_uid.setdefault(str(involved["uid"]), []).append(event)
    causes: list[_Cause] = []
    for pod in sorted(pods, key=_pod_order):
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        cause = _pod_cause(pod, by_uid.get(str(pod["metadata"].get("uid")), []), nodes)
        if cause is not None:
            causes.append(cause)
    for event in _latest_first(cluster_events):
        if event.get("reason") in _CREATE_FAILED:
            causes.append(_refused(str(event.get("message") or "")))
            break
    if not causes:
        return None
    groups: dict[tuple[str, str], list[str]] = {}
    for cause in causes:
        groups.setdefault((cause.reason, cause.detail), []).append(cause.pod)
    ordered = sorted(groups.items(), key=lambda item: -len(item[1]))
    parts = [f"{detail} ({_pods(names)})" if names[0] else detail for (_, detail), names in ordered]
    return Diagnosis(ordered[0][0][0], "; ".join(parts))


def _pod_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "")
    return ({"worker": 0, "head": 1}.get(role, 2), str(pod["metadata"].get("name")))


def _pods(names: list[str]) -> str:
    if len(names) == 1:
        return f"pod {names[0]}"
    return f"{len(names)} pods: {', '.join(names[:2])}{', ...' if len(names) > 2 else ''}"


def _latest_first(events: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(
        events,
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""),
        reverse=True,
    )


def _pod_cause(
    pod: Mapping[str, Any], events: list[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]] | None
) -> _Cause | None:
    name = str(pod["metadata"]["name"])
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    images = {
        c.get("name"): c.get("image") for c in [*spec.get("initContainers", []), *spec.get("containers", [])]
    }
    for container in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        message = str(waiting.get("message") or "")
        if reason in IMAGE_PULL_REASONS:
            image = images.get(container.get("name")) or container.get("image")
            return _Cause(
                "ImagePullFailed",
                f'image "{image}" cannot be pulled ({reason}): check its name and tag, the registry, '
                "and the pull Secrets",
                name,
            )
        if reason == "CreateContainerConfigError":
            return _config_cause(message, name)
        if reason == "CrashLoopBackOff":
            return _Cause(
                "CrashLoopBackOff",
                f"container {container.get('name')} keeps failing "
                f"({container.get('restartCount', 0)} restarts)",
                name,
            )
        if reason not in _STARTING:
            return _Cause(reason, f"container {container.get('name')} is waiting: {reason}: {message}", name)
    for event in _latest_first(events):
        if event.get("reason") == "FailedMount":
            found = _MISSING.search(str(event.get("message") or ""))
            if found:
                return _missing(found.group(1), found.group(2), name, "a volume")
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return _unschedulable(pod, str(condition.get("message") or ""), nodes)
    return None


def _config_cause(message: str, pod: str) -> _Cause:
    found = _MISSING.search(message)
    if found:
        return _missing(found.group(1), found.group(2), pod, "an env variable")
    key = _MISSING_KEY.search(message)
    if key:
        kind = "Secret" if key.group(2).lower() == "secret" else "ConfigMap"
        return _Cause(
            f"Missing{kind}Key", f"{kind} {key.group(4)} has no key {key.group(1)} (an env reference)", pod
        )
    return _Cause("ContainerConfigError", f"the container cannot be configured: {message}", pod)


def _missing(kind: str, name: str, pod: str, use: str) -> _Cause:
    kind = "Secret" if kind.lower() == "secret" else "ConfigMap"
    return _Cause(f"Missing{kind}", f'{kind} "{name}" (referenced by {use}) does not exist', pod)


def _refused(message: str) -> _Cause:
    """A pod the API refused to create (KubeRay's Event on the RayCluster carries the API's words:
    for a ResourceQuota, the quota's name, requested, used and limited amounts)."""
    if "exceeded quota" in message:
        detail = message[message.index("exceeded quota") :]
        return _Cause(
            "QuotaExceeded", f"the namespace's ResourceQuota refuses the Ray cluster's pods: {detail}", ""
        )
    return _Cause("PodCreateRefused", f"the API refuses the Ray cluster's pods: {message}", "")


def _unschedulable(pod: Mapping[str, Any], message: str, nodes: Sequence[Mapping[str, Any]] | None) -> _Cause:
    """No node can take the pod. With the nodes at hand, say which of the scheduler's filters no
    node passes, with numbers; without, the scheduler's message stands."""
    name = str(pod["metadata"]["name"])
    spec = pod.get("spec") or {}
    selector = dict(spec.get("nodeSelector") or {})
    if "persistentvolumeclaim" in message.lower():
        return _Cause("VolumeNotBound", f"unschedulable: {message}", name)
    if nodes is None:
        return _Cause(_reason_from_scheduler(message), f"unschedulable: {message}", name)
    selected = [n for n in nodes if _matches(n, selector)]
    if not selected:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return _Cause(
            "NoMatchingNode",
            f"no node has the labels its nodeSelector asks for ({wanted}; {len(nodes)} nodes checked)",
            name,
        )
    tolerations = list(spec.get("tolerations") or [])
    allowed = [n for n in selected if not _untolerated(n, tolerations)]
    if not allowed:
        taints = sorted({_taint_text(t) for n in selected for t in _untolerated(n, tolerations)})
        return _Cause(
            "UntoleratedTaint",
            f"the {len(selected)} nodes matching its nodeSelector have taints it does not tolerate: "
            f"{', '.join(taints)}",
            name,
        )
    for resource, wanted_count in _extended_requests(pod).items():
        allocatable = [_count((n.get("status") or {}).get("allocatable", {}).get(resource)) for n in allowed]
        most = max(allocatable)
        if most < wanted_count:
            return _Cause(
                _insufficient_reason(resource),
                f"it requests {wanted_count} {resource}, but the most any of the {len(allowed)} nodes "
                f"it may run on can allocate is {most} ({sum(allocatable)} on them all)",
                name,
            )
        if f"Insufficient {resource}" in message:
            fits = sum(1 for a in allocatable if a >= wanted_count)
            return _Cause(
                _insufficient_reason(resource),
                f"it requests {wanted_count} {resource}; {fits} of the {len(allowed)} nodes it may run "
                f"on can allocate that many, but not that many are free now (in use by other pods)",
                name,
            )
    return _Cause(_reason_from_scheduler(message), f"unschedulable: {message}", name)


def _reason_from_scheduler(message: str) -> str:
    insufficient = _INSUFFICIENT.search(message)
    if insufficient:
        return _insufficient_reason(insufficient.group(1))
    if "untolerated taint" in message:
        return "UntoleratedTaint"
    if "node affinity/selector" in message:
        return "NoMatchingNode"
    return "Unschedulable"


def _insufficient_reason(resource: str) -> str:
    return "InsufficientGPU" if resource.endswith("/gpu") else "InsufficientResources"


def _matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _untolerated(node: Mapping[str, Any], tolerations: list[dict[str, Any]]) -> list[Mapping[str, Any]]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [
        t for t in taints if t.get("effect") in _REPELLING and not any(_tolerates(x, t) for x in tolerations)
    ]


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ToleratesTaint: effect (empty matches all), key (empty with Exists matches all),
    and Exists or an equal value."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"
    if toleration.get("key") != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _extended_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's whole-number requests of extended resources (a vendor's GPUs, RDMA devices): what
    a node's allocatable is compared with. cpu and memory are left to the scheduler's message."""
    total: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource, amount in amounts.items():
            if "/" in resource and not resource.startswith(("kubernetes.io/", "hugepages-")):
                total[resource] = total.get(resource, 0) + _count(amount)
    return total


def _count(value: Any) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def startup_expired(rayjob: Mapping[str, Any], deadline_seconds: int, now: str) -> bool:
    """The attempt has not started within `deadline_seconds` of its startTime (KubeRay's, set when
    it leaves New: each retry and each resume starts the clock again, and a queued or suspended
    RayJob is not counted), or KubeRay itself found so (its preRunningDeadlineSeconds)."""
    status = rayjob.get("status") or {}
    if status.get("reason") == KUBERAY_EXPIRY and status.get("jobDeploymentStatus") in ("Failed", "Retrying"):
        return True
    if status.get("jobDeploymentStatus") not in STARTING_DEPLOYMENT or not status.get("startTime"):
        return False
    started = _parse_time(str(status["startTime"]))
    return _parse_time(now) >= started + datetime.timedelta(seconds=deadline_seconds)


def starting_for(rayjob: Mapping[str, Any], now: str) -> float:
    """Seconds since the attempt started (KubeRay's startTime); 0 without one."""
    start = (rayjob.get("status") or {}).get("startTime")
    if not start:
        return 0.0
    return (_parse_time(now) - _parse_time(str(start))).total_seconds()


def deadline_at(rayjob: Mapping[str, Any], deadline_seconds: int) -> str | None:
    """When the attempt fails if it has not started (RFC 3339), or None if it is not starting."""
    status = rayjob.get("status") or {}
    if status.get("jobDeploymentStatus") not in STARTING_DEPLOYMENT or not status.get("startTime"):
        return None
    at = _parse_time(str(status["startTime"])) + datetime.timedelta(seconds=deadline_seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

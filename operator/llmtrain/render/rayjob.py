"""The KubeRay RayJob: a head group (driver, dashboard, no GPU) and one GPU worker group.

Every Ray pod mounts the shared storage at the same path (Ray Train's storage_path must be
shared), a memory-backed /dev/shm, and runs under the restricted Pod Security profile, except the
workers of the infiniband and efa profiles, which add IPC_LOCK (render/fabric.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.spec import INT32_MAX, STARTUP_BACKSTOP_SECONDS
from llmtrain.constants import (
    CONFIG_DIR,
    CONFIG_PATH,
    DEFAULT_TRAINER_IMAGE,
    JOB_LABEL,
    JOB_UID_LABEL,
    KUEUE_PREFERRED_TOPOLOGY_ANNOTATION,
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_REQUIRED_TOPOLOGY_ANNOTATION,
    RAY_GROUP_VERSION,
    RAY_VERSION,
    RAY_VERSION_ENV,
    RAYJOB_KIND,
    ROLE_LABEL,
    SUSPENDED_BY_USER_ANNOTATION,
)
from llmtrain.render.fabric import fabric_devices, worker_capabilities
from llmtrain.render.labels import object_meta
from llmtrain.render.names import configmap_name, rayjob_name, trainer_account_name
from llmtrain.render.network import container_env
from llmtrain.render.storage import claim_name

ENTRYPOINT = f"python -m llmtrain_trainer.main --config {CONFIG_PATH}"
RAY_UID = 1000
WORKER_GROUP = "workers"
SUBMITTER_BACKOFF_LIMIT = 2  # re-runs of the submitter pod before the RayJob counts a failure


@dataclass(frozen=True)
class ImageSettings:
    """Operator-wide defaults the spec does not carry."""

    trainer_image: str = DEFAULT_TRAINER_IMAGE
    ray_version: str = RAY_VERSION
    image_pull_policy: str = "IfNotPresent"
    # Secrets (in each job's namespace) every trainer pod pulls with, before the spec's own.
    pull_secrets: tuple[str, ...] = ()


POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RAY_UID,
    "runAsGroup": RAY_UID,
    "fsGroup": RAY_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Seconds a Ray pod (and the submitter) gets between SIGTERM and SIGKILL. KubeRay does not stop the
# Ray job before it deletes the cluster (suspend, preemption, delete) and there is no preStop hook;
# with Kubernetes' default 30 s, real pods went on training and checkpointing for those 30 s after
# a suspend (the status already said Suspended), held their node that long, and a re-created job
# waited for them. `ray start`'s own SIGTERM handling needs a few seconds at most, and a checkpoint
# cut short is skipped on restore (checkpoint.py), so a kill loses nothing.
TERMINATION_GRACE_SECONDS = 5
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def ray_version(job: LLMTrainingJob, images: ImageSettings) -> str:
    """The Ray the job's pods run: the spec's for its own image, else the operator's default image's.
    KubeRay gates features on it (token authentication needs 2.52), so it must be the image's."""
    res = job.spec.resources
    return res.ray_version if res.image and res.ray_version else images.ray_version


def _env(job: LLMTrainingJob, images: ImageSettings, uses_gpu: bool) -> list[dict[str, Any]]:
    spec = job.spec
    env: list[dict[str, Any]] = [
        {"name": "LLMTRAIN_JOB_NAME", "value": job.metadata.name},
        {"name": "LLMTRAIN_JOB_NAMESPACE", "value": job.metadata.namespace},
        {"name": "HF_HOME", "value": f"{spec.storage.mount_path}/hf-cache"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if job.metadata.uid:  # the trainer waits until its mounted config is this incarnation's
        env.append({"name": "LLMTRAIN_JOB_UID", "value": job.metadata.uid})
    # The trainer's driver compares it with the Ray it imports (a custom image's may differ).
    env.append({"name": RAY_VERSION_ENV, "value": ray_version(job, images)})
    if not uses_gpu:
        env.append({"name": "DS_ACCELERATOR", "value": "cpu"})
    secrets = {"HF_TOKEN": spec.model.hf_token_secret_ref}
    if spec.tracking is not None:
        secrets.update(spec.tracking.secret_env())
    plain: dict[str, str] = {}
    if spec.object_storage is not None:  # the object URIs' stores: pyarrow reads these
        secrets.update(spec.object_storage.secret_env())
        plain.update(spec.object_storage.plain_env())
    if spec.checkpoint.push_to_hub is not None:  # the Hub push's write token
        secrets.update(spec.checkpoint.push_to_hub.secret_env())
    user = container_env(spec.network, uses_gpu)
    chosen = {var["name"] for var in user}  # network.env wins over the derived references
    env.extend({"name": name, "value": value} for name, value in plain.items() if name not in chosen)
    for name, ref in secrets.items():
        if ref is not None and name not in chosen:
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env.extend(user)
    return env


def _volumes(job: LLMTrainingJob) -> list[dict[str, Any]]:
    return [
        {"name": "shared-storage", "persistentVolumeClaim": {"claimName": claim_name(job)}},
        {"name": "trainer-config", "configMap": {"name": configmap_name(job.metadata.name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.resources.shared_memory}},
        *(v.to_wire() for v in job.spec.pod_template.volumes),
    ]


def _mounts(job: LLMTrainingJob) -> list[dict[str, Any]]:
    return [
        {"name": "shared-storage", "mountPath": job.spec.storage.mount_path},
        {"name": "trainer-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *(m.to_wire() for m in job.spec.pod_template.volume_mounts),
    ]


def _pull_secrets(job: LLMTrainingJob, images: ImageSettings) -> list[dict[str, str]]:
    """The operator's defaults, then the spec's, each Secret once."""
    names = [*images.pull_secrets, *(s.name for s in job.spec.pod_template.image_pull_secrets)]
    return [{"name": name} for name in dict.fromkeys(names)]


def _template_metadata(job: LLMTrainingJob, labels: dict[str, str]) -> dict[str, Any]:
    """The overlay's labels and annotations; the platform's labels last (the CRD refuses the
    overlay's keys under them anyway)."""
    overlay = job.spec.pod_template
    if job.metadata.uid:
        # Which incarnation of the job a pod belongs to: a namesake's job waits for these to go.
        labels = {**labels, JOB_UID_LABEL: job.metadata.uid}
    meta: dict[str, Any] = {"labels": {**overlay.labels, **labels}}
    if overlay.annotations:
        meta["annotations"] = dict(overlay.annotations)
    return meta


def _pod_spec(
    job: LLMTrainingJob,
    images: ImageSettings,
    container: dict[str, Any],
    *,
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
) -> dict[str, Any]:
    res = job.spec.resources
    pod: dict[str, Any] = {
        "serviceAccountName": trainer_account_name(job.metadata.name),
        "securityContext": POD_SECURITY_CONTEXT,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": _volumes(job),
    }
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    if res.priority_class_name:
        pod["priorityClassName"] = res.priority_class_name
    if pull_secrets := _pull_secrets(job, images):
        pod["imagePullSecrets"] = pull_secrets
    return pod


def _container(
    job: LLMTrainingJob, images: ImageSettings, name: str, resources: dict[str, str]
) -> dict[str, Any]:
    uses_gpu = job.spec.resources.gpus_per_worker > 0
    return {
        "name": name,
        "image": job.spec.resources.image or images.trainer_image,
        "imagePullPolicy": images.image_pull_policy,
        "env": _env(job, images, uses_gpu),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": _mounts(job),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
    }


def _gpu_toleration(job: LLMTrainingJob) -> dict[str, Any]:
    """GPU nodes are commonly tainted with the resource name."""
    return {"key": job.spec.resources.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"}


def _head_tolerations(job: LLMTrainingJob) -> list[dict[str, Any]]:
    """The head (and the submitter) go where `resources.nodeSelector` sends the workers; when that
    is a tainted GPU pool they must tolerate its taint too, or they stay Pending. Without a node
    selector they do not tolerate it, so they stay off GPU nodes."""
    res = job.spec.resources
    tolerations = [t.to_wire() for t in res.tolerations]
    if res.node_selector and res.gpus_per_worker > 0:
        tolerations.append(_gpu_toleration(job))
    return tolerations


def _head_group(job: LLMTrainingJob, images: ImageSettings) -> dict[str, Any]:
    head = job.spec.resources.head
    container = _container(job, images, "ray-head", {"cpu": head.cpu, "memory": head.memory})
    container["ports"] = [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
    ]
    return {
        # num-cpus 0: no training worker is ever scheduled on the head.
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
        "template": {
            "metadata": _template_metadata(job, {JOB_LABEL: job.metadata.name, ROLE_LABEL: "head"}),
            "spec": _pod_spec(
                job,
                images,
                container,
                node_selector=dict(job.spec.resources.node_selector),
                tolerations=_head_tolerations(job),
            ),
        },
    }


def _worker_group(job: LLMTrainingJob, images: ImageSettings) -> dict[str, Any]:
    res = job.spec.resources
    limits = {"cpu": res.cpu, "memory": res.memory}
    node_selector = dict(res.node_selector)
    tolerations = [t.to_wire() for t in res.tolerations]
    if res.gpus_per_worker > 0:
        limits[res.gpu_resource_name] = str(res.gpus_per_worker)
        tolerations.append(_gpu_toleration(job))
        if res.accelerator_type:
            node_selector[res.accelerator_label_key] = res.accelerator_type
    limits.update(fabric_devices(job.spec))
    container = _container(job, images, "ray-worker", limits)
    capabilities = worker_capabilities(job.spec, CONTAINER_SECURITY_CONTEXT["capabilities"])
    if capabilities != CONTAINER_SECURITY_CONTEXT["capabilities"]:
        container["securityContext"] = {**CONTAINER_SECURITY_CONTEXT, "capabilities": capabilities}
    metadata = _template_metadata(job, {JOB_LABEL: job.metadata.name, ROLE_LABEL: "worker"})
    if res.topology is not None:
        # Kueue reads a podset's topology request from its pod template; the head is a podset of one.
        key, level = (
            (KUEUE_REQUIRED_TOPOLOGY_ANNOTATION, res.topology.required)
            if res.topology.required
            else (KUEUE_PREFERRED_TOPOLOGY_ANNOTATION, res.topology.preferred)
        )
        others = (KUEUE_REQUIRED_TOPOLOGY_ANNOTATION, KUEUE_PREFERRED_TOPOLOGY_ANNOTATION)
        annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in others}
        metadata["annotations"] = {**annotations, key: str(level)}
    return {
        "groupName": WORKER_GROUP,
        "replicas": res.workers,
        "minReplicas": res.workers,
        "maxReplicas": res.workers,
        "rayStartParams": {},
        "template": {
            "metadata": metadata,
            "spec": _pod_spec(job, images, container, node_selector=node_selector, tolerations=tolerations),
        },
    }


def _submitter_template(job: LLMTrainingJob, images: ImageSettings) -> dict[str, Any]:
    """KubeRay's default submitter pod has no securityContext (restricted namespaces reject it) and
    no placement: it goes where the head goes, with the job's priority."""
    res = job.spec.resources
    placement: dict[str, Any] = {}
    if res.node_selector:
        placement["nodeSelector"] = dict(res.node_selector)
    if tolerations := _head_tolerations(job):
        placement["tolerations"] = tolerations
    if res.priority_class_name:
        placement["priorityClassName"] = res.priority_class_name
    if pull_secrets := _pull_secrets(job, images):
        placement["imagePullSecrets"] = pull_secrets
    return {
        "metadata": _template_metadata(job, {JOB_LABEL: job.metadata.name, ROLE_LABEL: "submitter"}),
        "spec": {
            "restartPolicy": "Never",
            # It talks to Ray's job API only (with the Ray token KubeRay injects), never to
            # Kubernetes: no ServiceAccount token in it.
            "automountServiceAccountToken": False,
            **placement,
            "securityContext": POD_SECURITY_CONTEXT,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": job.spec.resources.image or images.trainer_image,
                    "imagePullPolicy": images.image_pull_policy,
                    "resources": {
                        "requests": {"cpu": "200m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                    "securityContext": CONTAINER_SECURITY_CONTEXT,
                }
            ],
        },
    }


def render_rayjob(job: LLMTrainingJob, images: ImageSettings) -> dict[str, Any]:
    policy = job.spec.run_policy
    meta = object_meta(job, rayjob_name(job.metadata.name), "training")
    if policy.queue_name and not policy.suspend:
        meta["labels"][KUEUE_QUEUE_LABEL] = policy.queue_name
    if policy.workload_priority_class:
        # On the RayJob from its creation: Kueue refuses it added to a running job, or removed.
        meta["labels"][KUEUE_PRIORITY_CLASS_LABEL] = policy.workload_priority_class
    if policy.suspend:
        # Created suspended, a queued RayJob is not given to Kueue until resumed (the label is
        # added then, never removed): Kueue would admit it before its Workload could be
        # deactivated. Suspended after it was queued (or while Kueue manages it without a queue
        # name), its Workload is deactivated (operator/workload.py), and the mark tells the
        # status that its user, not the queue, holds it.
        meta["annotations"] = {SUSPENDED_BY_USER_ANNOTATION: "true"}
    spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        # Always true: suspend and Kueue require it, and a finished job must release its GPUs.
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": policy.ttl_seconds_after_finished,
        "backoffLimit": policy.max_retries,
        # KubeRay (>= 1.6) fails an attempt still Initializing (or Waiting) this long after its
        # start, but then retries it: the operator's own check (operator/startup.py) enforces the
        # deadline from the same startTime, and KubeRay's, later by STARTUP_BACKSTOP_SECONDS (an
        # int32: clamped), is the backstop. Older KubeRays prune the field.
        "preRunningDeadlineSeconds": min(
            policy.startup_deadline_seconds + STARTUP_BACKSTOP_SECONDS, INT32_MAX
        ),
        # A queued job is created suspended, as Kueue expects; from then on Kueue owns the field.
        "suspend": policy.suspend or policy.queue_name is not None,
        # The submitter checks `ray job status` before it submits (KubeRay >= 1.3), so a re-run
        # submitter re-attaches to the running Ray job instead of submitting a second one: a
        # dropped log stream, a drained node or a preempted submitter costs a pod, not a retry on a
        # fresh cluster. An application failure is read from the dashboard, not the exit code.
        "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
        "submitterPodTemplate": _submitter_template(job, images),
        "rayClusterSpec": {
            "rayVersion": ray_version(job, images),
            # Ray's dashboard and job API refuse requests without the cluster's token; KubeRay
            # makes a per-cluster Secret (owned by the RayCluster) and injects it into every pod.
            "authOptions": {"mode": "token"},
            "enableInTreeAutoscaling": False,
            "headGroupSpec": _head_group(job, images),
            "workerGroupSpecs": [_worker_group(job, images)],
        },
    }
    if policy.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = policy.active_deadline_seconds
    return {"apiVersion": RAY_GROUP_VERSION, "kind": RAYJOB_KIND, "metadata": meta, "spec": spec}

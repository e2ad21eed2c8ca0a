"""Each rendering requirement of the foundation issue, asserted directly."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.spec import DEFAULT_STARTUP_DEADLINE_SECONDS, INT32_MAX, STARTUP_BACKSTOP_SECONDS
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.api.validation import parse_job
from llmtrain.constants import (
    CONFIG_FILENAME,
    JOB_LABEL,
    MANAGED_BY_LABEL,
    MAX_NAME_LENGTH,
    OPERATOR_NAME,
    RAY_VERSION,
    RAY_VERSION_ENV,
    REPORTER_NAME,
)
from llmtrain.operator.config import DEFAULT_RESYNC_SECONDS, DEFAULT_STARTUP_LOOK_SECONDS
from llmtrain.render import ImageSettings, render
from llmtrain.render.names import child_name, configmap_name, pvc_name, rayjob_name, trainer_account_name
from llmtrain.render.network import PROFILES
from llmtrain.render.rayjob import CONTAINER_SECURITY_CONTEXT, TERMINATION_GRACE_SECONDS
from llmtrain.render.rbac import render_reporter_rbac
from llmtrain.render.trainer_config import cluster_trainer_config

from tests.support.jobs import load_example, minimal_job, with_path

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _job(doc: dict[str, Any]) -> LLMTrainingJob:
    return parse_job(doc)


def _by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs}


def _gpu_job(**spec: Any) -> dict[str, Any]:
    base = {
        "resources": {
            "workers": 4,
            "gpusPerWorker": 8,
            "acceleratorType": "NVIDIA-H100-80GB-HBM3",
            "cpu": "96",
            "memory": "1000Gi",
            "sharedMemory": "64Gi",
            "head": {"cpu": "3", "memory": "12Gi"},
            "nodeSelector": {"pool": "training"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "priorityClassName": "high",
        },
        "network": {
            "ncclProfile": "infiniband",
            "env": [{"name": "NCCL_IB_TIMEOUT", "value": "30"}, {"name": "EXTRA", "value": "1"}],
        },
        "model": {"name": "meta-llama/Meta-Llama-3-8B", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
    }
    base.update(spec)
    return minimal_job("llama", namespace="team-a", **base)


def rayjob(doc: dict[str, Any]) -> dict[str, Any]:
    return _by_kind(render(_job(doc)))["RayJob"]


def pods(rj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    cluster = rj["spec"]["rayClusterSpec"]
    return cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]


def templates(rj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    cluster = rj["spec"]["rayClusterSpec"]
    return cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["containers"][0]["env"]}


def test_children_with_claim_and_with_created_pvc() -> None:
    kinds = [o["kind"] for o in render(_job(minimal_job()))]
    assert kinds == ["ServiceAccount", "ConfigMap", "RayJob"]
    created = with_path(
        minimal_job(), "spec.storage", {"create": {"size": "100Gi", "storageClassName": "rwx"}}
    )
    objs = _by_kind(render(_job(created)))
    pvc = objs["PersistentVolumeClaim"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "100Gi"}},
        "storageClassName": "rwx",
    }
    volumes = {v["name"]: v for v in pods(objs["RayJob"])[1]["volumes"]}
    assert volumes["shared-storage"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    # A claim of the user's own: mounted as it is, none created.
    claimed = _by_kind(render(_job(with_path(minimal_job(), "spec.storage", {"claimName": "corpus"}))))
    assert "PersistentVolumeClaim" not in claimed
    for pod in pods(claimed["RayJob"]):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["shared-storage"]["persistentVolumeClaim"] == {"claimName": "corpus"}
    # Ray's autoscaler stays off: the workers are the spec's, started together and never scaled.
    assert objs["RayJob"]["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False


def test_a_created_claim_outlives_the_job_unless_reclaim_is_delete() -> None:
    """Retain (the default): no owner reference, so the garbage collector leaves the claim and the
    model on it when the job goes; its labels still name the job and its uid. Delete: owned."""
    created = with_path(minimal_job(), "spec.storage", {"create": {"size": "1Gi"}})
    retained = _by_kind(render(_stored(created, "uid-1")))["PersistentVolumeClaim"]["metadata"]
    assert "ownerReferences" not in retained
    assert retained["labels"]["llmtrain.dev/job"] == created["metadata"]["name"]
    assert retained["labels"]["llmtrain.dev/job-uid"] == "uid-1"
    deleted = with_path(created, "spec.storage.create.reclaim", "Delete")
    (owner,) = _by_kind(render(_stored(deleted, "uid-1")))["PersistentVolumeClaim"]["metadata"][
        "ownerReferences"
    ]
    assert owner["uid"] == "uid-1" and owner["kind"] == "LLMTrainingJob"
    # Every other child is the job's either way.
    for obj in render(_stored(created, "uid-1")):
        if obj["kind"] != "PersistentVolumeClaim":
            assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == ["uid-1"], obj["kind"]


def _stored(doc: dict[str, Any], uid: str) -> LLMTrainingJob:
    """The job as the API server returns it: with a uid."""
    return _job({**doc, "metadata": {**doc["metadata"], "uid": uid}})


def _rendered_config(job: LLMTrainingJob) -> TrainerConfig:
    raw = _by_kind(render(job))["ConfigMap"]["data"][CONFIG_FILENAME]
    return TrainerConfig.model_validate(json.loads(raw), by_alias=True, by_name=False)


def test_configmap_is_immutable_readable_json_without_nulls() -> None:
    """Immutable, so the config a running job trains with never changes under it; labelled as the
    trainer's config; its JSON indented by two for `kubectl get -o yaml` and without the unset
    fields (a null is no value the trainer could use)."""
    configmap = _by_kind(render(_job(minimal_job())))["ConfigMap"]
    assert configmap["immutable"] is True
    assert configmap["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer-config"
    text = configmap["data"][CONFIG_FILENAME]
    assert "null" not in text
    second = text.splitlines()[1]
    assert second.startswith('  "') and not second.startswith('   "')


def test_configmap_holds_a_parseable_trainer_config_with_deterministic_run() -> None:
    config = _rendered_config(_stored(_gpu_job(), "uid-1"))
    assert config.run_name == "uid-1"
    assert config.storage_path == "/mnt/llmtrain/runs/team-a/llama"
    assert str(config.run_dir) == "/mnt/llmtrain/runs/team-a/llama/uid-1"
    assert config.resume_from is None
    assert config.scaling.num_workers == 32 and config.scaling.use_gpu
    assert config.scaling.cpus_per_worker == 12.0
    assert config.progress.report_to_kubernetes
    # The same job renders the same run, so every retry resumes from the same checkpoints.
    assert render(_stored(_gpu_job(), "uid-1")) == render(_stored(_gpu_job(), "uid-1"))


def test_a_job_recreated_under_the_same_name_gets_a_new_run() -> None:
    first = _rendered_config(_stored(_gpu_job(), "uid-1"))
    again = _rendered_config(_stored(_gpu_job(), "uid-2"))
    assert first.storage_path == again.storage_path  # discoverable: every run of the job side by side
    assert first.run_dir != again.run_dir
    assert str(_rendered_config(_job(_gpu_job())).run_dir).endswith("/llama/no-uid")  # `llmtrain render`


def test_resume_from_resolves_against_the_shared_storage() -> None:
    run = _rendered_config(_stored(_gpu_job(resumeFrom={"run": "old/uid-0"}), "uid-1")).resume_from
    assert run is not None and (run.runs_root, run.run, run.checkpoint) == (
        "/mnt/llmtrain/runs/team-a",
        "old/uid-0",
        None,
    )
    seed = _rendered_config(_stored(_gpu_job(resumeFrom={"checkpoint": "seeds/step-9"}), "u")).resume_from
    assert seed is not None and seed.checkpoint == "/mnt/llmtrain/seeds/step-9"
    absolute = {"checkpoint": "/mnt/llmtrain/seeds/step-9"}
    seed = _rendered_config(_stored(_gpu_job(resumeFrom=absolute), "u")).resume_from
    assert seed is not None and seed.checkpoint == "/mnt/llmtrain/seeds/step-9"


def test_trainer_identity_is_the_jobs_own_service_account() -> None:
    """No Role per job: the namespace's reporter Role grants the status patch, and the chart's
    reporter policy confines each account to the job it is named after."""
    objs = _by_kind(render(_job(_gpu_job())))
    assert "Role" not in objs and "RoleBinding" not in objs
    account = objs["ServiceAccount"]["metadata"]
    assert account["name"] == "llama-trainer"
    head, worker = pods(objs["RayJob"])
    assert head["serviceAccountName"] == worker["serviceAccountName"] == account["name"]


def test_the_namespace_reporter_role_grants_status_patch_to_its_service_accounts() -> None:
    role, binding = render_reporter_rbac("team-a")
    assert role["metadata"]["name"] == binding["metadata"]["name"] == REPORTER_NAME
    for obj in (role, binding):
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "reporter"
        assert obj["metadata"]["labels"][MANAGED_BY_LABEL] == OPERATOR_NAME
    assert role["rules"] == [
        {"apiGroups": ["llmtrain.dev"], "resources": ["llmtrainingjobs/status"], "verbs": ["patch"]}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": REPORTER_NAME,
    }
    assert binding["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts:team-a"}
    ]
    for obj in (role, binding):
        meta = obj["metadata"]
        # Every job's, no job's: no job label (the containment policy tells it apart so), no owner.
        assert meta["namespace"] == "team-a" and "ownerReferences" not in meta
        assert meta["labels"][MANAGED_BY_LABEL] == OPERATOR_NAME and JOB_LABEL not in meta["labels"]


def test_head_group_has_no_gpu_head_resources_and_dashboard() -> None:
    rj = rayjob(_gpu_job())
    head_group = rj["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head_group["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head_group["rayStartParams"]["num-cpus"] == "0"
    head = head_group["template"]["spec"]["containers"][0]
    assert head["resources"]["limits"] == {"cpu": "3", "memory": "12Gi"} == head["resources"]["requests"]
    assert 8265 in [p["containerPort"] for p in head["ports"]]


def test_worker_group_gpus_placement_and_replicas() -> None:
    rj = rayjob(_gpu_job())
    group = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 4
    pod = group["template"]["spec"]
    res = pod["containers"][0]["resources"]
    # _gpu_job is on InfiniBand: the worker also requests the RDMA device.
    expected = {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
    assert res["limits"] == res["requests"] == expected
    assert pod["nodeSelector"] == {"pool": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "high"


def test_head_and_submitter_follow_the_workers_node_selector_and_tolerate_its_gpu_taint() -> None:
    """A node selector sending the job to a tainted GPU pool: the head and the submitter pod go
    there too and tolerate the taint, or they would stay Pending; with the job's priority."""
    rj = rayjob(_gpu_job())
    head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    submitter = rj["spec"]["submitterPodTemplate"]["spec"]
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    for pod in (head, submitter):
        assert pod["nodeSelector"] == {"pool": "training"}  # no accelerator label: no GPU wanted
        assert gpu_taint in pod["tolerations"]
        assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        assert pod["priorityClassName"] == "high"
    # Without a node selector they do not tolerate the GPU taint: they stay off GPU nodes.
    doc = _gpu_job()
    del doc["spec"]["resources"]["nodeSelector"]
    head = rayjob(doc)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert gpu_taint not in head.get("tolerations", [])
    # Nor on a CPU job sent to a pool: it has no GPU taint to tolerate.
    cpu = with_path(_gpu_job(), "spec.resources.gpusPerWorker", 0)
    del cpu["spec"]["resources"]["acceleratorType"]
    cpu["spec"]["network"] = {"ncclProfile": "auto"}
    head = rayjob(cpu)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"pool": "training"} and gpu_taint not in head["tolerations"]


def test_custom_gpu_resource_and_label_key() -> None:
    doc = _gpu_job()
    doc["spec"]["resources"].update(
        gpuResourceName="amd.com/gpu", acceleratorLabelKey="amd.com/gpu.product-name"
    )
    pod = pods(rayjob(doc))[1]
    assert pod["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "8"
    assert "amd.com/gpu.product-name" in pod["nodeSelector"]
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_cpu_job_has_no_gpu_limits_tolerations_or_nccl() -> None:
    doc = load_example("tiny-cpu.yaml")
    head, worker = pods(rayjob(doc))
    assert "nvidia.com/gpu" not in worker["containers"][0]["resources"]["limits"]
    assert "tolerations" not in worker
    for pod in (head, worker):
        assert not [n for n in env_of(pod) if n.startswith(("NCCL_", "TORCH_NCCL"))]
        assert env_of(pod)["DS_ACCELERATOR"]["value"] == "cpu"


def test_shared_memory_storage_and_config_mounted_on_every_pod() -> None:
    for pod in pods(rayjob(_gpu_job())):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm"
        assert mounts["/mnt/llmtrain"] == "shared-storage"
        assert mounts["/etc/llmtrain"] == "trainer-config"


def test_the_hub_cache_is_on_the_shared_storage_of_every_ray_pod() -> None:
    """HF_HOME (Hub downloads: model, tokenizer) is under the claim's mount on the head and the
    workers, wherever storage.mountPath puts it: every rank and every retry of the job finds the
    first download there instead of fetching the model again."""
    doc = with_path(_gpu_job(), "spec.storage.mountPath", "/data/shared")
    for pod in pods(rayjob(doc)):
        container = pod["containers"][0]
        home = env_of(pod)["HF_HOME"]["value"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["shared-storage"] == "/data/shared"
        assert home.startswith("/data/shared/"), home


def test_restricted_security_context_on_every_pod_and_container() -> None:
    rj = rayjob(_gpu_job(network={"ncclProfile": "nvlink"}))
    all_pods = [*pods(rj), rj["spec"]["submitterPodTemplate"]["spec"]]
    for pod in all_pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True


def test_every_pod_is_killed_soon_after_sigterm() -> None:
    """Nothing in a Ray or submitter pod acts on SIGTERM: a long grace period only keeps a suspended
    or deleted job training (and holding its node) after its status says it stopped."""
    rj = rayjob(_gpu_job())
    for pod in [*pods(rj), rj["spec"]["submitterPodTemplate"]["spec"]]:
        assert pod["terminationGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS <= 5


def test_hf_token_only_by_secret_reference() -> None:
    rj = rayjob(_gpu_job())
    for pod in pods(rj):
        token = env_of(pod)["HF_TOKEN"]
        assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "value" not in env_of(pods(rj)[0])["HF_TOKEN"]


def test_tracking_credentials_and_secret_env_reach_head_and_workers_as_references_only() -> None:
    """spec.tracking's token and API key and a network.env entry with valueFrom become
    secretKeyRef entries of the head's and the workers' container; no object the operator writes
    (pods, ConfigMap) holds a value for them, and the TrainerConfig carries the tracking block."""
    doc = _gpu_job(
        tracking={
            "mlflow": {"trackingUri": "http://mlflow:5000", "tokenSecretRef": {"name": "ml", "key": "token"}},
            "wandb": {"project": "p", "apiKeySecretRef": {"name": "wb", "key": "key"}},
            "tensorboard": {},
        },
        network={
            "env": [
                {
                    "name": "MLFLOW_TRACKING_PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": "ml", "key": "pw"}},
                }
            ]
        },
    )
    objects = _by_kind(render(_job(doc)))
    expected = {
        "MLFLOW_TRACKING_TOKEN": ("ml", "token"),
        "WANDB_API_KEY": ("wb", "key"),
        "MLFLOW_TRACKING_PASSWORD": ("ml", "pw"),
    }
    for pod in pods(objects["RayJob"]):
        env = env_of(pod)
        for name, (secret, key) in expected.items():
            assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
    config = TrainerConfig.model_validate_json(objects["ConfigMap"]["data"][CONFIG_FILENAME])
    assert config.tracking is not None and config.tracking.backends() == ["mlflow", "wandb", "tensorboard"]
    assert config.tracking.mlflow is not None and config.tracking.mlflow.tracking_uri == "http://mlflow:5000"


def test_network_env_overrides_a_derived_secret_reference() -> None:
    """A network.env entry of the same name replaces the tracking block's reference (one entry)."""
    doc = _gpu_job(
        tracking={"wandb": {"project": "p", "apiKeySecretRef": {"name": "wb", "key": "key"}}},
        network={
            "env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}]
        },
    )
    for pod in pods(rayjob(doc)):
        names = [e["name"] for e in pod["containers"][0]["env"]]
        assert names.count("WANDB_API_KEY") == 1
        assert env_of(pod)["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "other"


def test_nccl_profile_env_with_overrides_winning() -> None:
    for pod in pods(rayjob(_gpu_job())):
        env = {k: v.get("value") for k, v in env_of(pod).items()}
        for key, value in PROFILES["infiniband"].items():
            if key != "NCCL_IB_TIMEOUT":
                assert env[key] == value
        assert env["NCCL_IB_TIMEOUT"] == "30"  # user override beats the profile's 22
        assert env["EXTRA"] == "1"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "1800"
        # WARN asked; on a fabric NCCL logs INFO of INIT and NET to its file for the start-up check.
        assert env["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_renders(profile: str) -> None:
    doc = _gpu_job(network={"ncclProfile": profile})
    env = env_of(pods(rayjob(doc))[1])
    assert set(PROFILES[profile]) <= set(env)


def test_a_finished_ray_cluster_is_kept_five_minutes_by_default() -> None:
    """The default ttlSecondsAfterFinished holds a finished job's GPUs only long enough to read its
    logs (the earlier default, 3600, kept idle GPUs for an hour); the README documents 300."""
    spec = rayjob(_gpu_job())["spec"]
    assert spec["ttlSecondsAfterFinished"] == 300
    assert spec["shutdownAfterJobFinishes"] is True  # without it KubeRay ignores the TTL


def test_rayjob_policy_fields() -> None:
    doc = _gpu_job(
        runPolicy={
            "maxRetries": 4,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "suspend": True,
            "queueName": "gpu-q",
        }
    )
    rj = rayjob(doc)
    spec = rj["spec"]
    assert spec["entrypoint"] == "python -m llmtrain_trainer.main --config /etc/llmtrain/trainer-config.json"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 60
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["backoffLimit"] == 4
    assert spec["suspend"] is True
    # A re-run submitter re-attaches to the Ray job (KubeRay >= 1.3), so it gets KubeRay's retries.
    assert spec["submitterConfig"] == {"backoffLimit": 2}
    # Ray's dashboard and job API need the cluster's token (KubeRay's per-cluster Secret).
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    # Queued but created suspended by its user: not given to Kueue until resumed (Kueue would admit
    # it before its Workload could be deactivated), and marked as the user's suspend.
    assert "kueue.x-k8s.io/queue-name" not in rj["metadata"]["labels"]
    assert rj["metadata"]["annotations"] == {"llmtrain.dev/suspended": "true"}
    # A queued job starts suspended even when the user did not ask: Kueue admits it.
    queued = rayjob(_gpu_job(runPolicy={"queueName": "gpu-q"}))
    assert queued["spec"]["suspend"] is True
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-q"
    assert "annotations" not in queued["metadata"]
    plain = rayjob(_gpu_job())
    assert plain["spec"]["suspend"] is False
    assert "activeDeadlineSeconds" not in plain["spec"]
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_kuberays_startup_deadline_leaves_the_operator_time_to_fail_the_job_first() -> None:
    """KubeRay retries an attempt past its preRunningDeadlineSeconds (a second Ray cluster), so it is
    the job's startupDeadlineSeconds plus a margin longer than the operator takes to notice (its
    start-up look and a resync, at their defaults), within int32."""
    assert STARTUP_BACKSTOP_SECONDS > DEFAULT_STARTUP_LOOK_SECONDS + DEFAULT_RESYNC_SECONDS
    for deadline, kuberays in (
        (30, 30 + STARTUP_BACKSTOP_SECONDS),
        (DEFAULT_STARTUP_DEADLINE_SECONDS, DEFAULT_STARTUP_DEADLINE_SECONDS + STARTUP_BACKSTOP_SECONDS),
        (INT32_MAX - 1, INT32_MAX),
        (INT32_MAX, INT32_MAX),
    ):
        spec = rayjob(_gpu_job(runPolicy={"startupDeadlineSeconds": deadline}))["spec"]
        assert spec["preRunningDeadlineSeconds"] == kuberays, deadline
    assert rayjob(_gpu_job())["spec"]["preRunningDeadlineSeconds"] == 900 + STARTUP_BACKSTOP_SECONDS


def test_kueue_priority_class_and_topology_requests_reach_the_rayjob() -> None:
    """runPolicy.workloadPriorityClass becomes Kueue's priority-class label on the RayJob (from its
    creation: Kueue refuses it added to a running job); resources.topology becomes Kueue's podset
    annotation on the workers' template only, over one the podTemplate overlay may carry."""
    doc = _gpu_job(
        runPolicy={"queueName": "gpu-q", "workloadPriorityClass": "research-high"},
        podTemplate={"annotations": {"kueue.x-k8s.io/podset-preferred-topology": "rack", "team": "a"}},
    )
    doc["spec"]["resources"]["topology"] = {"required": "cloud.example.com/topology-block"}
    rj = rayjob(doc)
    assert rj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research-high"
    head, worker = templates(rj)
    assert worker["metadata"]["annotations"] == {
        "team": "a",
        "kueue.x-k8s.io/podset-required-topology": "cloud.example.com/topology-block",
    }
    assert "kueue.x-k8s.io/podset-required-topology" not in head["metadata"].get("annotations", {})
    doc["spec"]["resources"]["topology"] = {"preferred": "kubernetes.io/hostname"}
    _, worker = templates(rayjob(doc))
    assert (
        worker["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"]
        == "kubernetes.io/hostname"
    )
    plain = rayjob(_gpu_job())
    assert "kueue.x-k8s.io/priority-class" not in plain["metadata"]["labels"]
    assert not any("topology" in k for k in templates(plain)[1]["metadata"].get("annotations", {}))
    with pytest.raises(Exception, match="exactly one of required and preferred"):
        bad = _gpu_job()
        bad["spec"]["resources"]["topology"] = {}
        _job(bad)


def test_labels_names_and_owner_references() -> None:
    doc = _gpu_job()
    doc["metadata"]["uid"] = "1234-uid"
    for obj in render(_job(doc)):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "llmtrain"
        assert labels["app.kubernetes.io/instance"] == "llama"
        assert labels["app.kubernetes.io/managed-by"] == "llmtrain-operator"
        assert labels["app.kubernetes.io/component"]
        assert labels["llmtrain.dev/job"] == "llama"
        name = obj["metadata"]["name"]
        assert len(name) <= MAX_NAME_LENGTH and DNS1035.match(name), name
        assert obj["metadata"]["namespace"] == "team-a"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "llmtrain.dev/v1alpha1",
            "kind": "LLMTrainingJob",
            "name": "llama",
            "uid": "1234-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_long_names_stay_within_47_and_distinct() -> None:
    name = "a" * 47
    names = {child_name(name, s) for s in ("", "config", "storage", "trainer")}
    assert len(names) == 4
    assert all(len(n) <= 47 and DNS1035.match(n) for n in names)
    assert child_name(name, "config") == child_name(name, "config")


def test_child_names_are_the_job_name_and_suffix_up_to_47_then_hashed() -> None:
    """The operator adopts its children by these names and the chart's policy recomputes them: each
    is `<job>-<suffix>` while that fits in 47 characters, else the job name cut at a dash-free end,
    the first five hex digits of the full name's SHA-256, and the suffix."""
    assert [f("llama") for f in (rayjob_name, configmap_name, pvc_name, trainer_account_name)] == [
        "llama",
        "llama-config",
        "llama-storage",
        "llama-trainer",
    ]
    fits = "a" * (MAX_NAME_LENGTH - len("-config"))
    assert configmap_name(fits) == f"{fits}-config"
    # Cut at 47 - len("-12345-config") = 34 characters: the 34th is a dash, which goes.
    long = "a" * 33 + "-" + "b" * 20
    digest = hashlib.sha256(f"{long}-config".encode()).hexdigest()[:5]
    assert configmap_name(long) == f"{'a' * 33}-{digest}-config"
    # Without a suffix, the cut is at 47 - len("-12345") = 41.
    long = "a" * 40 + "-" + "b" * 10
    assert rayjob_name(long) == "a" * 40 + f"-{hashlib.sha256(long.encode()).hexdigest()[:5]}"


def test_render_is_pure() -> None:
    doc = _gpu_job()
    before = copy.deepcopy(doc)
    job = _job(doc)
    snapshot = job.model_dump()
    first = render(job, ImageSettings(trainer_image="registry.example/trainer:1"))
    assert render(job, ImageSettings(trainer_image="registry.example/trainer:1")) == first
    assert job.model_dump() == snapshot and doc == before
    assert pods(first[-1])[0]["containers"][0]["image"] == "registry.example/trainer:1"


def test_image_override_in_spec_wins() -> None:
    doc = _gpu_job()
    doc["spec"]["resources"]["image"] = "mine/trainer:dev"
    for pod in pods(rayjob(doc)):
        assert pod["containers"][0]["image"] == "mine/trainer:dev"


OVERLAY = {
    "labels": {"team": "nlp", "ray.io-like.example.com/x": "y"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/train"},
    "imagePullSecrets": [{"name": "registry"}, {"name": "shared"}],
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus", "readOnly": True}}],
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
}


def test_the_pod_template_overlay_reaches_every_trainer_pod_and_the_service_account() -> None:
    job = _job(_gpu_job(podTemplate=OVERLAY))
    objects = _by_kind(render(job, ImageSettings(pull_secrets=("shared", "org-default"))))
    rj = objects["RayJob"]
    cluster = rj["spec"]["rayClusterSpec"]
    templates = {
        "head": cluster["headGroupSpec"]["template"],
        "worker": cluster["workerGroupSpecs"][0]["template"],
        "submitter": rj["spec"]["submitterPodTemplate"],
    }
    for role, template in templates.items():
        labels = template["metadata"]["labels"]
        assert labels["team"] == "nlp" and labels["llmtrain.dev/job"] == "llama", role
        assert labels["llmtrain.dev/role"] == role
        assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        # The operator's defaults first, then the spec's, each Secret once.
        pulls = [s["name"] for s in template["spec"]["imagePullSecrets"]]
        assert pulls == ["shared", "org-default", "registry"], role
    for role in ("head", "worker"):
        pod = templates[role]["spec"]
        assert pod["volumes"][-1] == OVERLAY["volumes"][0]
        assert [v["name"] for v in pod["volumes"]] == ["shared-storage", "trainer-config", "dshm", "data"]
        assert pod["containers"][0]["volumeMounts"][-1] == OVERLAY["volumeMounts"][0]
    # The submitter runs no training code: no extra volumes, and no Kubernetes credentials.
    assert "volumes" not in templates["submitter"]["spec"]
    assert templates["submitter"]["spec"]["automountServiceAccountToken"] is False
    account = objects["ServiceAccount"]
    assert account["metadata"]["annotations"] == OVERLAY["serviceAccountAnnotations"]


def test_without_an_overlay_the_pods_carry_only_the_platforms_metadata() -> None:
    rj = rayjob(_gpu_job())
    head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"] == {"labels": {"llmtrain.dev/job": "llama", "llmtrain.dev/role": "head"}}
    assert "imagePullSecrets" not in head["spec"]
    assert "imagePullSecrets" not in rj["spec"]["submitterPodTemplate"]["spec"]


@pytest.mark.parametrize("example", ["tiny-cpu-custom.yaml", "tiny-cpu-hf.yaml"])
def test_trainer_modes_render_the_same_structure(example: str) -> None:
    """Only the ConfigMap's trainer block differs from the built-in trainer's rendering: same
    children, same RayJob (entrypoint included), and a custom path resolved on the shared storage."""
    doc = load_example(example)
    builtin = copy.deepcopy(doc)
    del builtin["spec"]["trainer"]
    mode, base = _by_kind(render(_job(doc))), _by_kind(render(_job(builtin)))
    assert list(mode) == list(base)
    for kind in mode:
        if kind != "ConfigMap":
            assert mode[kind] == base[kind], kind
    raw = mode["ConfigMap"]["data"][CONFIG_FILENAME]
    config = TrainerConfig.model_validate(json.loads(raw), by_alias=True, by_name=False)
    assert config.trainer.type == doc["spec"]["trainer"]["type"]
    if config.trainer.custom is not None:
        assert config.trainer.custom.function == "tiny_train:train"
        assert config.trainer.custom.path == "/mnt/llmtrain/custom"
    else:
        assert config.trainer.huggingface is not None
        assert config.trainer.huggingface.args == {"optim": "adamw_torch", "adam_beta2": 0.98}


# ---- fabric profiles (infiniband, efa): devices and IPC_LOCK on the workers only ----------------
def _worker_container(doc: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pods(rayjob(doc))[1]["containers"][0]
    return container


@pytest.mark.parametrize("profile", ["auto", "nvlink", "ethernet"])
def test_other_profiles_keep_todays_restricted_pods_exactly(profile: str) -> None:
    """Every pod of a non-fabric profile is what it was: no device, no capability, no NCCL log
    file; only the profile's NCCL variables differ between them."""

    def without_env(rj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(rj)
        for pod in [*pods(out), out["spec"]["submitterPodTemplate"]["spec"]]:
            for c in pod["containers"]:
                c.pop("env", None)
        return out

    doc = _gpu_job(network={"ncclProfile": profile})
    rj = rayjob(doc)
    assert without_env(rj) == without_env(rayjob(_gpu_job(network={"ncclProfile": "auto"})))
    worker = _worker_container(doc)
    assert worker["securityContext"] == CONTAINER_SECURITY_CONTEXT
    assert set(worker["resources"]["limits"]) == {"cpu", "memory", "nvidia.com/gpu"}
    assert "NCCL_DEBUG_FILE" not in env_of(pods(rj)[1])


@pytest.mark.parametrize(
    ("profile", "device"), [("infiniband", "rdma/rdma_shared_device_a"), ("efa", "vpc.amazonaws.com/efa")]
)
def test_fabric_workers_request_their_device_and_add_ipc_lock_when_asked(profile: str, device: str) -> None:
    rj = rayjob(_gpu_job(network={"ncclProfile": profile, "fabric": {"ipcLock": True}}))
    head, worker_pod = pods(rj)
    worker = worker_pod["containers"][0]
    assert worker["resources"]["limits"][device] == "1" and worker["resources"]["requests"][device] == "1"
    assert worker["securityContext"] == {
        **CONTAINER_SECURITY_CONTEXT,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    # The head and the submitter stay restricted, without the device.
    for pod in (head, rj["spec"]["submitterPodTemplate"]["spec"]):
        for c in pod["containers"]:
            assert c["securityContext"] == CONTAINER_SECURITY_CONTEXT
            assert device not in c["resources"]["limits"]


@pytest.mark.parametrize("profile", ["infiniband", "efa"])
def test_fabric_workers_add_no_capability_by_default(profile: str) -> None:
    """IPC_LOCK is opt-in: at UID 1000 it is not effective, and it forces privileged Pod Security."""
    worker = _worker_container(_gpu_job(network={"ncclProfile": profile}))
    assert worker["securityContext"] == CONTAINER_SECURITY_CONTEXT  # restricted


def test_fabric_device_name_and_count_are_configurable() -> None:
    fabric = {"resourceName": "nvidia.com/hostdev", "perWorker": 8}
    worker = _worker_container(_gpu_job(network={"ncclProfile": "infiniband", "fabric": fabric}))
    assert worker["resources"]["limits"]["nvidia.com/hostdev"] == "8"
    assert "rdma/rdma_shared_device_a" not in worker["resources"]["limits"]
    assert worker["securityContext"] == CONTAINER_SECURITY_CONTEXT


def test_fabric_profiles_have_nccl_log_its_transport_to_a_file_per_process() -> None:
    env = {k: v.get("value") for k, v in env_of(pods(rayjob(_gpu_job()))[1]).items()}
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == "/tmp/llmtrain-nccl.%h.%p.log"
    # A chosen level of INFO or more is kept, with NCCL's own subsystems.
    trace = _gpu_job(network={"ncclProfile": "efa", "ncclDebug": "TRACE"})
    env = {k: v.get("value") for k, v in env_of(pods(rayjob(trace))[1]).items()}
    assert env["NCCL_DEBUG"] == "TRACE" and "NCCL_DEBUG_SUBSYS" not in env
    assert env["NCCL_NET_PLUGIN"] == "ofi"  # the image's libnccl-net-ofi.so


def test_nccl_debug_is_the_chosen_level_and_info_keeps_ncclss_own_subsystems() -> None:
    """The level the user chose reaches NCCL_DEBUG on every profile; on a fabric one, INFO itself
    counts as "INFO or more" (no subsystem selection added), and no other debug variable appears."""

    def env(network: dict[str, Any]) -> dict[str, Any]:
        return {k: v.get("value") for k, v in env_of(pods(rayjob(_gpu_job(network=network)))[1]).items()}

    assert env({"ncclProfile": "nvlink", "ncclDebug": "TRACE"})["NCCL_DEBUG"] == "TRACE"
    for level in ("INFO", "TRACE"):
        chosen = env({"ncclProfile": "infiniband", "ncclDebug": level})
        debug = {k: v for k, v in chosen.items() if "debug" in k.lower()}
        assert debug == {"NCCL_DEBUG": level, "NCCL_DEBUG_FILE": "/tmp/llmtrain-nccl.%h.%p.log"}


def test_one_gpu_per_worker_is_a_gpu_worker_with_its_fabric_device() -> None:
    """One GPU a worker is enough for the NCCL settings and, on a fabric profile, the device."""
    doc = with_path(_gpu_job(), "spec.resources.gpusPerWorker", 1)
    worker = _worker_container(doc)
    env = {e["name"]: e for e in worker["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["value"] == "1"
    assert "NCCL_IB_HCA" in env or "NCCL_DEBUG_FILE" in env
    assert worker["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    head = pods(rayjob(doc))[0]
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert gpu_taint in head["tolerations"]  # the pool's taint, as for eight GPUs a worker
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["trainer-config"]["readOnly"] is True  # the config the job trains with


def test_a_user_variable_without_a_value_is_set_empty() -> None:
    network = {"env": [{"name": "EMPTY"}, {"name": "BLANK", "value": ""}]}
    env = {e["name"]: e for e in _worker_container(_gpu_job(network=network))["env"]}
    assert env["EMPTY"] == {"name": "EMPTY", "value": ""}
    assert env["BLANK"] == {"name": "BLANK", "value": ""}


def test_every_ray_container_knows_its_job_and_prints_unbuffered() -> None:
    """The job's name and namespace for the user's code, the uid the trainer waits to see in its
    mounted config (llmtrain_trainer.config.JOB_UID_ENV), and Python's output unbuffered so that
    the job's log follows the training."""
    for pod in pods(_by_kind(render(_stored(_gpu_job(), "uid-7")))["RayJob"]):
        env = env_of(pod)
        assert env["LLMTRAIN_JOB_NAME"] == {"name": "LLMTRAIN_JOB_NAME", "value": "llama"}
        assert env["LLMTRAIN_JOB_NAMESPACE"] == {"name": "LLMTRAIN_JOB_NAMESPACE", "value": "team-a"}
        assert env["LLMTRAIN_JOB_UID"] == {"name": "LLMTRAIN_JOB_UID", "value": "uid-7"}
        assert env["PYTHONUNBUFFERED"] == {"name": "PYTHONUNBUFFERED", "value": "1"}
    assert "LLMTRAIN_JOB_UID" not in env_of(pods(rayjob(_gpu_job()))[0])  # not stored yet: no uid


def test_the_ray_containers_are_ray_head_with_named_ports_and_ray_worker() -> None:
    """`kubectl logs -c ray-head` (or ray-worker) and a port-forward by port name reach them."""
    head, worker = pods(rayjob(_gpu_job()))
    assert [c["name"] for c in worker["containers"]] == ["ray-worker"]
    (container,) = head["containers"]
    assert container["name"] == "ray-head"
    assert container["ports"] == [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
    ]


def test_the_submitter_runs_once_small_and_bounded() -> None:
    """KubeRay's submitter Job retries by its backoff limit, not by restarting the container in
    place; its one container only submits and follows the job, so its requests stay small and its
    limits bound it on a shared node."""
    spec = rayjob(_gpu_job())["spec"]["submitterPodTemplate"]["spec"]
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["name"] == "ray-job-submitter"
    assert container["resources"] == {
        "requests": {"cpu": "200m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_the_config_volume_is_the_rendered_configmap() -> None:
    objects = _by_kind(render(_job(_gpu_job())))
    for pod in pods(objects["RayJob"]):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["trainer-config"]["configMap"] == {"name": objects["ConfigMap"]["metadata"]["name"]}


def test_each_child_names_its_component() -> None:
    """`kubectl get -l app.kubernetes.io/component=training` finds a job's RayJob, and so on."""
    created = with_path(minimal_job(), "spec.storage", {"create": {"size": "1Gi"}})
    components = {
        o["kind"]: o["metadata"]["labels"]["app.kubernetes.io/component"] for o in render(_job(created))
    }
    assert components == {
        "ServiceAccount": "trainer-identity",
        "PersistentVolumeClaim": "storage",
        "ConfigMap": "trainer-config",
        "RayJob": "training",
    }


def test_the_trainer_config_carries_the_network_for_the_start_up_check() -> None:
    doc = _gpu_job(network={"ncclProfile": "efa", "fabric": {"onSocketFallback": "warn"}})
    config = cluster_trainer_config(_job(doc))
    assert config.network.nccl_profile == "efa"
    assert config.network.fabric is not None and config.network.fabric.on_socket_fallback == "warn"


@pytest.mark.parametrize(
    ("workers", "gpus", "processes", "per_pod"), [(4, 8, 32, 8), (3, 0, 3, 1), (2, 1, 2, 1)]
)
def test_every_run_takes_the_specs_count_of_training_processes(
    tmp_path: Path, workers: int, gpus: int, processes: int, per_pod: int
) -> None:
    """ResourcesSpec.processes is the one count: the cluster's, a local GPU run's, and on the CPU
    (a local run without --gpu) one process per worker pod."""
    from llmtrain.render.trainer_config import local_trainer_config

    job = _job(_gpu_job(resources={"workers": workers, "gpusPerWorker": gpus}, network={}))
    assert (job.spec.resources.processes, job.spec.resources.processes_per_worker) == (processes, per_pod)
    scaling = cluster_trainer_config(job).scaling
    assert (scaling.num_workers, scaling.devices_per_worker, scaling.use_gpu) == (
        processes,
        per_pod,
        gpus > 0,
    )
    local = local_trainer_config(job, tmp_path, tmp_path, use_gpu=True).scaling
    assert (local.num_workers, local.devices_per_worker, local.use_gpu) == (processes, per_pod, True)
    on_cpu = local_trainer_config(job, tmp_path, tmp_path, use_gpu=False).scaling
    assert (on_cpu.num_workers, on_cpu.devices_per_worker, on_cpu.use_gpu) == (workers, 1, False)


def test_a_local_run_by_default_is_on_the_cpu_beside_the_job_file(tmp_path: Path) -> None:
    """`llmtrain run` without --gpu: one CPU process per worker pod, one core each, the run named
    "local" unless the caller names it, and relative data paths under the job file's folder."""
    from llmtrain.render.trainer_config import local_trainer_config

    job = _job(_gpu_job(dataset={"path": "data/train.txt"}))
    config = local_trainer_config(job, tmp_path / "jobs", tmp_path / "runs")
    assert (config.scaling.use_gpu, config.scaling.cpus_per_worker) == (False, 1.0)
    assert config.run_name == "local"
    assert not config.progress.report_to_kubernetes  # no job object to report to
    assert config.dataset.path == str((tmp_path / "jobs" / "data" / "train.txt").resolve())
    assert config.paths_base == str((tmp_path / "jobs").resolve())
    assert local_trainer_config(job, tmp_path, tmp_path, local_run_id="sweep-3").run_name == "sweep-3"


def test_the_cluster_config_reports_progress_at_the_given_interval() -> None:
    config = cluster_trainer_config(_job(_gpu_job()), progress_interval_seconds=7.5)
    assert config.progress.report_to_kubernetes and config.progress.interval_seconds == 7.5
    # The e2e tier finds a run's files under run_storage_path: where the config sends them.
    from llmtrain.render.trainer_config import run_storage_path

    assert config.storage_path == run_storage_path(_job(_gpu_job())) == "/mnt/llmtrain/runs/team-a/llama"


def _ray_version_of(doc: dict[str, Any], images: ImageSettings | None = None) -> tuple[str, set[str]]:
    """The RayJob's rayVersion, and the LLMTRAIN_RAY_VERSION of its head and worker containers."""
    (rayjob,) = [o for o in render(parse_job(doc), images or ImageSettings()) if o["kind"] == "RayJob"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    env = {
        e["value"]
        for p in pods
        for c in p["template"]["spec"]["containers"]
        for e in c["env"]
        if e["name"] == RAY_VERSION_ENV
    }
    return cluster["rayVersion"], env


def test_ray_version_follows_the_image() -> None:
    """The operator's default image's Ray (--trainer-ray-version), unless the job names its own image
    and that image's Ray; every Ray pod is told which, for the trainer's check."""
    assert _ray_version_of(minimal_job()) == (RAY_VERSION, {RAY_VERSION})
    assert _ray_version_of(minimal_job(), ImageSettings(ray_version="2.61.1")) == ("2.61.1", {"2.61.1"})
    custom = with_path(minimal_job(), "spec.resources.image", "r/trainer:mine")
    assert _ray_version_of(custom, ImageSettings(ray_version="2.61.1")) == ("2.61.1", {"2.61.1"})
    own = with_path(custom, "spec.resources.rayVersion", "2.53.0")
    assert _ray_version_of(own, ImageSettings(ray_version="2.61.1")) == ("2.53.0", {"2.53.0"})


def test_object_storage_credentials_reach_head_and_workers_as_secret_references() -> None:
    """spec.objectStorage becomes AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY secretKeyRef entries and
    plain AWS_ENDPOINT_URL / AWS_REGION values in every Ray container; the s3:// URIs stay URIs in
    the TrainerConfig (not resolved under the mount path)."""
    doc = _gpu_job(
        objectStorage={
            "endpoint": "http://s3.storage.svc:7070",
            "region": "eu-west-1",
            "accessKeySecretRef": {"name": "s3-creds", "key": "id"},
            "secretKeySecretRef": {"name": "s3-creds", "key": "secret"},
        },
        dataset={"path": "s3://corpus/tiny.txt"},
        checkpoint={"exportTo": "s3://models/tiny"},
    )
    objects = _by_kind(render(_job(doc)))
    for pod in pods(objects["RayJob"]):
        env = env_of(pod)
        assert env["AWS_ACCESS_KEY_ID"] == {
            "name": "AWS_ACCESS_KEY_ID",
            "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "id"}},
        }
        assert env["AWS_SECRET_ACCESS_KEY"] == {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "secret"}},
        }
        assert env["AWS_ENDPOINT_URL"] == {"name": "AWS_ENDPOINT_URL", "value": "http://s3.storage.svc:7070"}
        assert env["AWS_REGION"] == {"name": "AWS_REGION", "value": "eu-west-1"}
    config = TrainerConfig.model_validate_json(objects["ConfigMap"]["data"][CONFIG_FILENAME])
    assert config.dataset.path == "s3://corpus/tiny.txt"
    assert config.checkpoint.export_to == "s3://models/tiny"


def test_the_hub_push_token_reaches_every_pod_as_a_secret_reference_beside_hf_token() -> None:
    """checkpoint.pushToHub's token becomes LLMTRAIN_HUB_TOKEN through secretKeyRef in every Ray
    container, beside (not instead of) model.hfTokenSecretRef's HF_TOKEN, and counts among the
    Secrets `llmtrain submit` checks against the namespace's allowed-secrets list."""
    from llmtrain.advice import secrets_reaching_pods

    push = {"repoId": "my-org/tiny-sft", "tokenSecretRef": {"name": "hub-write", "key": "token"}}
    doc = _gpu_job(checkpoint={"pushToHub": push})
    objects = _by_kind(render(_job(doc)))
    for pod in pods(objects["RayJob"]):
        env = env_of(pod)
        assert env["LLMTRAIN_HUB_TOKEN"] == {
            "name": "LLMTRAIN_HUB_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hub-write", "key": "token"}},
        }
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert "hub-write" in secrets_reaching_pods(list(objects.values()))
    config = TrainerConfig.model_validate_json(objects["ConfigMap"]["data"][CONFIG_FILENAME])
    assert config.checkpoint.push_to_hub is not None
    assert config.checkpoint.push_to_hub.repo_id == "my-org/tiny-sft"


def test_gcs_and_azure_credentials_reach_head_and_workers_as_secret_references() -> None:
    """spec.objectStorage.gcs's service-account key and .azure's account key become secretKeyRef
    entries, their endpoints and the account plain values, in every Ray container; no S3 variable
    appears without S3 keys, and no Secret value is copied anywhere."""
    doc = _gpu_job(
        objectStorage={
            "gcs": {
                "credentialsSecretRef": {"name": "gcs-creds", "key": "key.json"},
                "endpoint": "http://gcs.storage.svc:4443",
            },
            "azure": {
                "accountName": "llmtrainstore",
                "accountKeySecretRef": {"name": "az-creds", "key": "account-key"},
                "endpoint": "http://10.0.0.7:10000",
            },
        },
        dataset={"path": "gs://corpus/tiny.txt"},
        checkpoint={"exportTo": "az://models/tiny"},
    )
    objects = _by_kind(render(_job(doc)))
    containers = pods(objects["RayJob"])
    assert len(containers) >= 2  # head and workers
    for pod in containers:
        env = env_of(pod)
        assert env["LLMTRAIN_GCS_CREDENTIALS"] == {
            "name": "LLMTRAIN_GCS_CREDENTIALS",
            "valueFrom": {"secretKeyRef": {"name": "gcs-creds", "key": "key.json"}},
        }
        assert env["AZURE_STORAGE_ACCOUNT_KEY"] == {
            "name": "AZURE_STORAGE_ACCOUNT_KEY",
            "valueFrom": {"secretKeyRef": {"name": "az-creds", "key": "account-key"}},
        }
        assert env["LLMTRAIN_GCS_ENDPOINT"]["value"] == "http://gcs.storage.svc:4443"
        assert env["AZURE_STORAGE_ACCOUNT_NAME"]["value"] == "llmtrainstore"
        assert env["LLMTRAIN_AZURE_ENDPOINT"]["value"] == "http://10.0.0.7:10000"
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} & set(env)
    config = TrainerConfig.model_validate_json(objects["ConfigMap"]["data"][CONFIG_FILENAME])
    assert config.dataset.path == "gs://corpus/tiny.txt"
    assert config.checkpoint.export_to == "az://models/tiny"
    assert config.object_storage is not None and config.object_storage.azure is not None
    assert config.object_storage.azure.account_name == "llmtrainstore"


def test_the_trainer_config_carries_the_failure_budget_timeout_and_method() -> None:
    doc = _gpu_job(
        runPolicy={"maxWorkerFailures": 7}, network={"collectiveTimeoutSeconds": 900}, method={"type": "lora"}
    )
    config = _rendered_config(_stored(doc, "uid-1"))
    assert (config.max_worker_failures, config.collective_timeout_seconds) == (7, 900)
    assert config.method.type == "lora"
    assert (config.job.name, config.job.namespace) == ("llama", "team-a")


def test_a_model_path_resolves_on_the_shared_storage_and_a_hub_id_stays() -> None:
    """model.name: a path (more than one slash, or leading . or /) is a checkpoint on the shared
    storage, relative to storage.mountPath; org/model is a hub id, passed as it is."""

    def model_name(name: str) -> str | None:
        model = {"name": name, "hfTokenSecretRef": {"name": "hf", "key": "token"}}
        return _rendered_config(_stored(_gpu_job(model=model), "uid-1")).model.name

    assert model_name("models/llama/final") == "/mnt/llmtrain/models/llama/final"
    assert model_name("/weights/llama") == "/weights/llama"
    assert model_name("final/") == "/mnt/llmtrain/final"
    assert model_name("./final") == "/mnt/llmtrain/final"
    assert model_name("meta-llama/Meta-Llama-3-8B") == "meta-llama/Meta-Llama-3-8B"
    # The trainer tries a hub-id-looking name as a folder under paths_base first (weights.py).
    assert _rendered_config(_stored(_gpu_job(), "uid-1")).paths_base == "/mnt/llmtrain"


def test_a_relative_validation_path_lies_on_the_shared_storage_and_a_uri_stays_a_uri() -> None:
    """dataset.validationPath resolves as dataset.path does: under storage.mountPath, or as is."""
    relative = _gpu_job(dataset={"path": "data/train", "validationPath": "data/val.jsonl"})
    config = _rendered_config(_stored(relative, "uid-1"))
    assert config.dataset.path == "/mnt/llmtrain/data/train"
    assert config.dataset.validation_path == "/mnt/llmtrain/data/val.jsonl"
    uri = _gpu_job(
        dataset={"path": "data/train", "validationPath": "gs://corpus/val.jsonl"},
        objectStorage={"gcs": {"credentialsSecretRef": {"name": "gcs-creds", "key": "key.json"}}},
    )
    assert _rendered_config(_stored(uri, "uid-1")).dataset.validation_path == "gs://corpus/val.jsonl"

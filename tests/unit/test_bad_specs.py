"""At least 30 distinct bad specs: each rejected offline by `llmtrain validate` with a message that
names the field, and, where a CRD can express it, by the CRD's own schema and CEL rules too; the
rest (inside the opaque inline model config) are accepted by the CRD and refused by the operator."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from llmtrain.api import cel, manifest_yaml
from llmtrain.api.crd import openapi_schema
from llmtrain.api.model_config import config_problems, sequence_problems
from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.cli import main
from llmtrain.constants import DEFAULT_MOUNT_PATH
from llmtrain.quantity import cpu_cores
from llmtrain.render.trainer_config import cluster_trainer_config

from tests.support.jobs import minimal_job, with_path
from tests.support.schema import validate_strict

BASE = minimal_job("bad")


GCS_STORE = {"credentialsSecretRef": {"name": "gcs", "key": "key.json"}}
AZURE_STORE = {"accountName": "acct", "accountKeySecretRef": {"name": "az", "key": "key"}}


def spec(path: str, value: Any) -> dict[str, Any]:
    return with_path(BASE, f"spec.{path}", value)


def inline_config(**changes: Any) -> dict[str, Any]:
    """A from-scratch model (tiny-cpu's shape) with `changes` to its config; None drops a key."""
    config: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 384,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    return spec("model", {"config": config, "tokenizer": "byte-level"})


# (id, document, text the error must contain (the field), caught by the CRD too?)
BAD: list[tuple[str, dict[str, Any], str, bool]] = [
    ("unknown-strategy", spec("strategy", {"type": "megatron"}), "strategy.type", True),
    (
        "zero-stage-with-fsdp",
        spec("strategy", {"type": "fsdp", "deepspeed": {"zeroStage": 2}}),
        "strategy.deepspeed",
        True,
    ),
    (
        "fsdp-block-with-deepspeed",
        spec("strategy", {"type": "deepspeed", "fsdp": {"cpuOffload": True}}),
        "strategy.fsdp",
        True,
    ),
    (
        "zero-stage-4",
        spec("strategy", {"type": "deepspeed", "deepspeed": {"zeroStage": 4}}),
        "zeroStage",
        True,
    ),
    (
        "offload-params-stage-2",
        spec("strategy", {"type": "deepspeed", "deepspeed": {"zeroStage": 2, "offloadParams": True}}),
        "offloadParams",
        True,
    ),
    ("both-storage-choices", spec("storage", {"claimName": "x", "create": {"size": "1Gi"}}), "storage", True),
    ("no-storage-choice", spec("storage", {"mountPath": "/data"}), "storage", True),
    ("storage-missing", spec("storage", None), "storage", True),
    ("negative-workers", spec("resources", {"workers": -1}), "resources.workers", True),
    ("zero-workers", spec("resources", {"workers": 0}), "resources.workers", True),
    ("workers-as-string", spec("resources", {"workers": "two"}), "resources.workers", True),
    ("bad-cpu-quantity", spec("resources", {"cpu": "lots"}), "resources.cpu", True),
    ("bad-memory-quantity", spec("resources", {"memory": "64GB"}), "resources.memory", True),
    ("bad-shm-quantity", spec("resources", {"sharedMemory": "-"}), "resources.sharedMemory", True),
    ("bad-pvc-size", spec("storage", {"create": {"size": "big"}}), "storage.create.size", True),
    ("head-cpu-as-word", spec("resources", {"head": {"cpu": "two"}}), "resources.head.cpu", True),
    ("head-memory-in-gb", spec("resources", {"head": {"memory": "8GB"}}), "resources.head.memory", True),
    ("shm-with-a-space", spec("resources", {"sharedMemory": "16 Gi"}), "resources.sharedMemory", True),
    (
        "pvc-size-missing",
        spec("storage", {"create": {"storageClassName": "rwx"}}),
        "storage.create.size",
        True,
    ),
    (
        "bad-access-mode",
        spec("storage", {"create": {"size": "1Gi", "accessModes": ["ReadWriteSometimes"]}}),
        "accessModes",
        True,
    ),
    (
        "relative-mount-path",
        spec("storage", {"claimName": "x", "mountPath": "data"}),
        "storage.mountPath",
        True,
    ),
    ("name-too-long", with_path(BASE, "metadata.name", "a" * 48), "metadata.name", True),
    ("name-not-dns1035", with_path(BASE, "metadata.name", "9lives"), "metadata.name", True),
    ("bad-env-name", spec("network", {"env": [{"name": "1BAD", "value": "x"}]}), "network.env", True),
    (
        "env-name-with-dash",
        spec("network", {"env": [{"name": "NCCL-DEBUG", "value": "x"}]}),
        "network.env",
        True,
    ),
    (
        "reserved-env-name",
        spec("network", {"env": [{"name": "LLMTRAIN_JOB_NAME", "value": "x"}]}),
        "network.env",
        True,
    ),
    ("unknown-nccl-profile", spec("network", {"ncclProfile": "token-ring"}), "network.ncclProfile", True),
    (
        "fp16-on-cpu",
        with_path(spec("resources", {"gpusPerWorker": 0}), "spec.training", {"precision": "fp16"}),
        "training.precision",
        True,
    ),
    ("lora-block-with-full", spec("method", {"type": "full", "lora": {"rank": 8}}), "method.lora", True),
    ("unknown-method", spec("method", {"type": "qlora-9000"}), "method.type", True),
    ("lora-rank-zero", spec("method", {"type": "lora", "lora": {"rank": 0}}), "lora.rank", True),
    ("lora-dropout-one", spec("method", {"type": "lora", "lora": {"dropout": 1.0}}), "lora.dropout", True),
    ("model-name-and-config", spec("model", {"name": "x", "config": {"model_type": "llama"}}), "model", True),
    ("model-neither", spec("model", {"revision": "main"}), "model", True),
    ("config-without-tokenizer", spec("model", {"config": {"model_type": "llama"}}), "model.tokenizer", True),
    ("dataset-name-and-path", spec("dataset", {"name": "x", "path": "/d"}), "dataset", True),
    ("unknown-dataset-format", spec("dataset", {"name": "x", "format": "csv"}), "dataset.format", True),
    ("tiny-seq-length", spec("dataset", {"name": "x", "maxSeqLength": 4}), "dataset.maxSeqLength", True),
    (
        "validation-split-too-big",
        spec("dataset", {"name": "x", "validationSplit": 0.9}),
        "dataset.validationSplit",
        True,
    ),
    ("negative-learning-rate", spec("training", {"learningRate": -0.1}), "training.learningRate", True),
    ("zero-learning-rate", spec("training", {"learningRate": 0}), "training.learningRate", True),
    ("unknown-precision", spec("training", {"precision": "fp8"}), "training.precision", True),
    ("unknown-scheduler", spec("training", {"lrScheduler": "exotic"}), "training.lrScheduler", True),
    (
        "selective-checkpointing-without-checkpointing",
        spec("training", {"checkpointEveryBlocks": 2}),
        "training.checkpointEveryBlocks",
        True,
    ),
    ("zero-checkpoint-interval", spec("checkpoint", {"everySteps": 0}), "checkpoint.everySteps", True),
    ("negative-retries", spec("runPolicy", {"maxRetries": -1}), "runPolicy.maxRetries", True),
    (
        "worker-failures-below-minus-one",
        spec("runPolicy", {"maxWorkerFailures": -2}),
        "runPolicy.maxWorkerFailures",
        True,
    ),
    (
        "zero-deadline",
        spec("runPolicy", {"activeDeadlineSeconds": 0}),
        "runPolicy.activeDeadlineSeconds",
        True,
    ),
    ("bad-queue-name", spec("runPolicy", {"queueName": "Gpu Queue"}), "runPolicy.queueName", True),
    ("unknown-spec-field", spec("learningRate", 0.1), "spec.learningRate", True),
    ("unknown-nested-field", spec("training", {"learning_rate": 0.1}), "training.learning_rate", True),
    ("gpus-too-many", spec("resources", {"gpusPerWorker": 64}), "resources.gpusPerWorker", True),
    (
        "bad-gpu-resource-name",
        spec("resources", {"gpuResourceName": "nvidia gpu"}),
        "resources.gpuResourceName",
        True,
    ),
    (
        "bad-toleration-operator",
        spec("resources", {"tolerations": [{"key": "a", "operator": "Maybe"}]}),
        "tolerations",
        True,
    ),
    (
        "secret-ref-without-key",
        spec("model", {"name": "x", "hfTokenSecretRef": {"name": "hf"}}),
        "hfTokenSecretRef.key",
        True,
    ),
    (
        "hybrid-shard-size-not-dividing-the-processes",
        with_path(
            spec("strategy", {"type": "fsdp", "fsdp": {"hybridShardSize": 3}}),
            "spec.resources",
            {"workers": 2, "gpusPerWorker": 4},
        ),
        "strategy.fsdp.hybridShardSize",
        True,
    ),
    (
        "offload-optimizer-on-cpu",
        with_path(
            spec("strategy", {"type": "deepspeed", "deepspeed": {"offloadOptimizer": True}}),
            "spec.resources",
            {"gpusPerWorker": 0},
        ),
        "offloadOptimizer",
        True,
    ),
    # KubeRay stores these as int32: a larger value must be refused before a RayJob is made.
    (
        "deadline-beyond-int32",
        spec("runPolicy", {"activeDeadlineSeconds": 2**31}),
        "activeDeadlineSeconds",
        True,
    ),
    (
        "ttl-beyond-int32",
        spec("runPolicy", {"ttlSecondsAfterFinished": 2**31}),
        "ttlSecondsAfterFinished",
        True,
    ),
    # The pod-template overlay: nothing that breaks the platform's own wiring or the pods' schema.
    (
        "pod-volume-two-sources",
        spec("podTemplate", {"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}),
        "podTemplate.volumes",
        True,
    ),
    (
        "pod-volume-host-path",
        spec("podTemplate", {"volumes": [{"name": "x", "hostPath": {"path": "/"}}]}),
        "hostPath",
        True,
    ),
    (
        "pod-volume-reserved-name",
        spec("podTemplate", {"volumes": [{"name": "dshm", "emptyDir": {}}]}),
        "podTemplate.volumes",
        True,
    ),
    (
        "pod-volume-duplicate-name",
        spec("podTemplate", {"volumes": [{"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}}]}),
        "podTemplate.volumes",
        True,
    ),
    (
        "pod-mount-of-no-volume",
        spec("podTemplate", {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
        "podTemplate.volumeMounts",
        True,
    ),
    (
        "pod-mount-over-shared-memory",
        spec(
            "podTemplate",
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}],
            },
        ),
        "podTemplate.volumeMounts",
        True,
    ),
    (
        "pod-mount-under-shared-storage",
        spec(
            "podTemplate",
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": f"{DEFAULT_MOUNT_PATH}/runs"}],
            },
        ),
        "podTemplate.volumeMounts",
        True,
    ),
    ("pod-label-bad-key", spec("podTemplate", {"labels": {"bad key!": "x"}}), "podTemplate.labels", True),
    (
        "pod-label-reserved-key",
        spec("podTemplate", {"labels": {"llmtrain.dev/job": "other"}}),
        "podTemplate.labels",
        True,
    ),
    (
        "pod-label-bad-value",
        spec("podTemplate", {"labels": {"team": "not valid!"}}),
        "podTemplate.labels",
        True,
    ),
    (
        "pod-annotation-bad-key",
        spec("podTemplate", {"annotations": {"-starts-with-dash": "x"}}),
        "podTemplate.annotations",
        True,
    ),
    (
        "service-account-annotation-bad-key",
        spec("podTemplate", {"serviceAccountAnnotations": {"a/b/c": "x"}}),
        "podTemplate.serviceAccountAnnotations",
        True,
    ),
    (
        "pull-secret-bad-name",
        spec("podTemplate", {"imagePullSecrets": [{"name": "Not_A_Name"}]}),
        "podTemplate.imagePullSecrets",
        True,
    ),
    # What KubeRay or Kubernetes would refuse later (a stuck pod or ValidationFailed), refused now.
    (
        "toleration-exists-with-value",
        spec("resources", {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}),
        "resources.tolerations",
        True,
    ),
    (
        "toleration-bad-value",
        spec("resources", {"tolerations": [{"key": "k", "operator": "Equal", "value": "a b"}]}),
        "value",
        True,
    ),
    (
        "node-selector-bad-key",
        spec("resources", {"nodeSelector": {"a/b/c": "x"}}),
        "resources.nodeSelector",
        True,
    ),
    (
        "node-selector-bad-value",
        spec("resources", {"nodeSelector": {"pool": "gpu pool"}}),
        "nodeSelector",
        True,
    ),
    (
        "topology-both-levels",
        spec("resources.topology", {"required": "kubernetes.io/hostname", "preferred": "rack"}),
        "resources.topology",
        True,
    ),
    ("accelerator-type-bad", spec("resources", {"acceleratorType": "H100 80GB"}), "acceleratorType", True),
    (
        "gpu-resource-not-a-gpu",
        spec("resources", {"gpuResourceName": "example.com/accelerator", "gpusPerWorker": 1}),
        "resources.gpuResourceName",
        True,
    ),
    (
        "storage-mounted-over-shm",
        spec("storage", {"claimName": "c", "mountPath": "/dev/shm"}),
        "storage.mountPath",
        True,
    ),
    (
        "storage-created-read-write-once",
        spec("storage", {"create": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
        "storage.create.accessModes",
        True,
    ),
    (
        "env-redis-address",
        spec("network", {"env": [{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]}),
        "network.env",
        True,
    ),
    (
        "env-token-as-a-literal",
        spec("network", {"env": [{"name": "WANDB_API_KEY", "value": "0123456789abcdef"}]}),
        "network.env",
        True,
    ),
    (
        "env-value-and-secret",
        spec(
            "network",
            {"env": [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        ),
        "network.env",
        True,
    ),
    (
        "tracking-without-a-tracker",
        spec("tracking", {"runName": "r"}),
        "tracking",
        True,
    ),
    (
        "tracking-mlflow-file-store",
        spec("tracking", {"mlflow": {"trackingUri": "file:///mnt/mlruns"}}),
        "tracking.mlflow.trackingUri",
        True,
    ),
    (
        "s3-dataset-without-object-storage",
        spec("dataset", {"path": "s3://corpus/tiny.txt"}),
        "dataset.path is an s3:// URI: set spec.objectStorage",
        True,
    ),
    (
        "s3-model-upper-case-bucket",
        spec("model", {"name": "s3://Models/tiny"}),
        "model.name: an object URI is s3://bucket/key",
        True,
    ),
    ("unknown-uri-scheme", spec("dataset", {"path": "ftp://host/data.txt"}), "dataset.path", True),
    (
        "s3-validation-file-without-object-storage",
        spec("dataset.validationPath", "s3://corpus/val.jsonl"),
        "dataset.validationPath is an s3:// URI: set spec.objectStorage",
        True,
    ),
    (
        "validation-file-upper-case-bucket",
        spec("dataset.validationPath", "gs://Corpus/val.jsonl"),
        "dataset.validationPath: an object URI is s3://bucket/key",
        True,
    ),
    (
        "validation-file-outside-the-storage",
        spec("dataset.validationPath", "data/../../etc/val.jsonl"),
        "dataset.validationPath cannot contain a '..' segment",
        True,
    ),
    (
        "eval-cadence-without-validation",
        spec("training.evalEverySteps", 50),
        "training.evalEverySteps needs an evaluation",
        True,
    ),
    (
        "export-to-not-a-uri",
        spec("checkpoint", {"exportTo": "/mnt/elsewhere"}),
        "checkpoint.exportTo",
        True,
    ),
    (
        "export-to-without-export",
        spec("checkpoint", {"export": False, "exportTo": "s3://models/run"}),
        "checkpoint.exportTo copies the export",
        True,
    ),
    (
        "push-to-hub-without-export",
        spec(
            "checkpoint",
            {"export": False, "pushToHub": {"repoId": "o/r", "tokenSecretRef": {"name": "hub", "key": "t"}}},
        ),
        "checkpoint.pushToHub uploads the export: it needs checkpoint.export: true",
        True,
    ),
    (
        "push-to-hub-inline-token",
        spec("checkpoint", {"pushToHub": {"repoId": "o/r", "tokenSecretRef": "hf_0123456789"}}),
        "checkpoint.pushToHub.tokenSecretRef",
        True,
    ),
    (
        "push-to-hub-repo-without-namespace",
        spec(
            "checkpoint", {"pushToHub": {"repoId": "tiny-sft", "tokenSecretRef": {"name": "h", "key": "t"}}}
        ),
        "checkpoint.pushToHub.repoId",
        True,
    ),
    (
        "object-storage-inline-key",
        spec(
            "objectStorage",
            {"accessKeySecretRef": {"name": "s3", "key": "id"}, "secretKeySecretRef": "hunter2"},
        ),
        "objectStorage.secretKeySecretRef",
        True,
    ),
    (
        "export-to-s3-without-object-storage",
        spec("checkpoint", {"exportTo": "s3://models/run"}),
        "checkpoint.exportTo is an s3:// URI",
        True,
    ),
    (
        "resume-checkpoint-bucket-too-short",
        spec("resumeFrom", {"checkpoint": "s3://x/checkpoint-step-00000100"}),
        "resumeFrom.checkpoint: an object URI is s3://bucket/key",
        True,
    ),
    (
        "resume-checkpoint-s3-without-object-storage",
        spec("resumeFrom", {"checkpoint": "s3://ckpt/checkpoint-step-00000100"}),
        "resumeFrom.checkpoint is an s3:// URI",
        True,
    ),
    *[
        (
            f"{scheme}-{where.replace('.', '-').lower()}-without-its-store",
            with_path(spec(where, f"{scheme}://corpus/a"), *other),
            f"{where} is {article} {scheme}:// URI: set spec.objectStorage.{store}",
            True,
        )
        for scheme, article, store, other in [
            # Another store's settings are not this one's.
            ("gs", "a", "gcs.credentialsSecretRef", ("spec.objectStorage", {"azure": AZURE_STORE})),
            ("az", "an", "azure with accountName", ("spec.objectStorage", {"gcs": GCS_STORE})),
        ]
        for where in [
            "dataset.path",
            "dataset.validationPath",
            "model.name",
            "resumeFrom.checkpoint",
            "checkpoint.exportTo",
        ]
    ],
    (
        "s3-dataset-with-only-gcs-settings",
        with_path(
            spec("dataset", {"path": "s3://corpus/tiny.txt"}), "spec.objectStorage", {"gcs": GCS_STORE}
        ),
        "dataset.path is an s3:// URI: set spec.objectStorage",
        True,
    ),
    (
        "object-storage-access-key-without-secret-key",
        spec("objectStorage", {"accessKeySecretRef": {"name": "s3", "key": "id"}}),
        "objectStorage.accessKeySecretRef and objectStorage.secretKeySecretRef go together",
        True,
    ),
    (
        "object-storage-azure-account-upper-case",
        spec(
            "objectStorage",
            {"azure": {**AZURE_STORE, "accountName": "MyAccount"}},
        ),
        "objectStorage.azure.accountName",
        True,
    ),
    (
        "env-autoscaler-v2",
        spec("network", {"env": [{"name": "RAY_enable_autoscaler_v2", "value": "1"}]}),
        "network.env",
        True,
    ),
    (
        "image-with-upper-case-path",
        spec("resources", {"image": "ghcr.io/LLMTrain/trainer:1"}),
        "resources.image",
        True,
    ),
    ("image-with-a-space", spec("resources", {"image": "trainer:latest build"}), "resources.image", True),
    # KubeRay refuses token authentication below Ray 2.52, and older Ray would ignore it.
    (
        "ray-version-below-token-auth",
        spec("resources", {"image": "r/trainer:1", "rayVersion": "2.51.9"}),
        "resources.rayVersion",
        True,
    ),
    (
        "ray-version-not-a-release",
        spec("resources", {"image": "r/trainer:1", "rayVersion": "2.60"}),
        "resources.rayVersion",
        True,
    ),
    ("ray-version-without-image", spec("resources", {"rayVersion": "2.60.0"}), "resources.rayVersion", True),
    (
        "dataset-path-escapes-the-storage",
        spec("dataset", {"path": "../other-team/data.jsonl"}),
        "dataset.path",
        True,
    ),
    (
        "fabric-devices-without-a-fabric-profile",
        spec("network", {"ncclProfile": "ethernet", "fabric": {"resourceName": "rdma/ib", "perWorker": 1}}),
        "network.fabric",
        True,
    ),
    (
        "fabric-profile-on-a-cpu-job",
        with_path(spec("resources", {"gpusPerWorker": 0}), "spec.network", {"ncclProfile": "efa"}),
        "network.ncclProfile",
        True,
    ),
    (
        "fabric-device-without-a-domain",
        spec("network", {"ncclProfile": "efa", "fabric": {"resourceName": "efa"}}),
        "network.fabric.resourceName",
        True,
    ),
    (
        "step-timeout-longer-than-the-collective-timeout",
        spec("network", {"collectiveTimeoutSeconds": 600, "stepTimeoutSeconds": 900}),
        "network.stepTimeoutSeconds",
        True,
    ),
    (
        "fabric-check-unknown-action",
        spec("network", {"ncclProfile": "infiniband", "fabric": {"onSocketFallback": "ignore"}}),
        "network.fabric.onSocketFallback",
        True,
    ),
    # Quantities: compared by `llmtrain validate` and the operator (the CRD's CEL has no quantities).
    (
        "shared-memory-over-memory",
        spec("resources", {"memory": "8Gi", "sharedMemory": "16Gi"}),
        "resources.sharedMemory",
        False,
    ),
    # One training process per GPU, each reserving at least half a Ray CPU: 8 x 0.5 = 4 Ray CPUs
    # against the 1 KubeRay gives the node would never be placed (the run waits forever).
    (
        "one-cpu-for-eight-gpus",
        spec("resources", {"cpu": "1", "gpusPerWorker": 8}),
        "resources.cpu",
        False,
    ),
    (
        "millicores-for-two-gpus",
        spec("resources", {"cpu": "900m", "gpusPerWorker": 2}),
        "resources.cpu",
        False,
    ),
    # Zero or negative quantities: valid quantity syntax, refused by a CEL rule on each field.
    ("zero-cpu", spec("resources", {"cpu": "0"}), "resources.cpu", True),
    ("negative-cpu", spec("resources", {"cpu": "-8"}), "resources.cpu", True),
    ("zero-memory", spec("resources", {"memory": "0Gi"}), "resources.memory", True),
    ("negative-memory", spec("resources", {"memory": "-64Gi"}), "resources.memory", True),
    ("zero-shared-memory", spec("resources", {"sharedMemory": "0"}), "resources.sharedMemory", True),
    ("zero-head-cpu", spec("resources", {"head": {"cpu": "0.0"}}), "resources.head.cpu", True),
    ("negative-head-memory", spec("resources", {"head": {"memory": "-8Gi"}}), "resources.head.memory", True),
    ("zero-storage-size", spec("storage", {"create": {"size": "0"}}), "storage.create.size", True),
    ("negative-storage-size", spec("storage", {"create": {"size": "-1Ti"}}), "storage.create.size", True),
    (
        "env-name-twice",
        spec(
            "network",
            {
                "env": [
                    {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT"},
                    {"name": "NCCL_DEBUG_SUBSYS", "value": "ALL"},
                ]
            },
        ),
        "network.env",
        True,
    ),
    # Strings where the API server wants a boolean or a number: it refuses them, so does validate
    # (no lax coercion of "yes" to true or "4" to 4).
    ("export-as-yes-string", spec("checkpoint", {"export": "yes"}), "checkpoint.export", True),
    ("suspend-as-true-string", spec("runPolicy", {"suspend": "true"}), "runPolicy.suspend", True),
    ("workers-as-numeric-string", spec("resources", {"workers": "4"}), "resources.workers", True),
    ("learning-rate-as-string", spec("training", {"learningRate": "0.001"}), "training.learningRate", True),
    ("gpus-as-boolean", spec("resources", {"gpusPerWorker": True}), "resources.gpusPerWorker", True),
    (
        "trust-remote-code-as-number",
        spec("model", {"name": "x", "trustRemoteCode": 1}),
        "model.trustRemoteCode",
        True,
    ),
    (
        "resume-from-run-and-checkpoint",
        spec("resumeFrom", {"run": "old/1234", "checkpoint": "seeds/a"}),
        "resumeFrom.run",
        True,
    ),
    ("resume-from-nothing", spec("resumeFrom", {}), "resumeFrom.run", True),
    (
        "resume-from-dot-dot",
        spec("resumeFrom", {"checkpoint": "runs/../../etc"}),
        "resumeFrom.checkpoint",
        True,
    ),
    (
        "resume-from-outside-storage",
        spec("resumeFrom", {"checkpoint": "/etc/seed"}),
        "resumeFrom.checkpoint",
        True,
    ),
    ("resume-from-run-traversal", spec("resumeFrom", {"run": "../other-ns/x"}), "resumeFrom.run", True),
    (
        "hf-args-override-output-dir",
        spec("trainer", {"type": "huggingface", "huggingface": {"args": {"output_dir": "/elsewhere"}}}),
        "trainer.huggingface.args",
        False,  # opaque to the API server's CEL: refused by validate and the operator
    ),
    (
        "hf-args-set-learning-rate",
        spec("trainer", {"type": "huggingface", "huggingface": {"args": {"learning_rate": 0.1}}}),
        "trainer.huggingface.args",
        False,  # opaque to the API server's CEL: refused by validate and the operator
    ),
    (
        "hf-block-with-builtin",
        spec("trainer", {"type": "builtin", "huggingface": {"args": {}}}),
        "trainer.huggingface",
        True,
    ),
    ("custom-without-function", spec("trainer", {"type": "custom"}), "trainer.custom", True),
    (
        "custom-bad-reference",
        spec("trainer", {"type": "custom", "custom": {"function": "my_module.train"}}),
        "trainer.custom.function",
        True,
    ),
    ("unknown-trainer", spec("trainer", {"type": "lightning"}), "trainer.type", True),
    (
        "hf-fsdp-on-cpu",
        with_path(
            with_path(BASE, "spec.trainer", {"type": "huggingface"}), "spec.resources", {"gpusPerWorker": 0}
        ),
        "strategy.type",
        True,
    ),
    (
        "hf-resume-from-checkpoint",
        with_path(
            with_path(BASE, "spec.trainer", {"type": "huggingface"}),
            "spec.resumeFrom",
            {"checkpoint": "runs/old/1234/checkpoint-step-00000100"},
        ),
        "spec.resumeFrom.checkpoint",
        True,
    ),
    (
        "early-stopping-without-validation",
        spec("training", {"earlyStopping": {"patience": 2}}),
        "training.earlyStopping",
        True,
    ),
    (
        "export-best-without-validation",
        spec("checkpoint", {"exportBest": True}),
        "checkpoint.exportBest",
        True,
    ),
    (
        "validation-file-and-split",
        with_path(spec("dataset.validationSplit", 0.05), "spec.dataset.validationPath", "val.jsonl"),
        "dataset.validationPath",
        True,
    ),
    (
        "eval-cadence-off-the-checkpoints",
        with_path(
            with_path(
                spec("training.evalEverySteps", 30), "spec.checkpoint", {"keepBest": True, "everySteps": 100}
            ),
            "spec.dataset.validationSplit",
            0.1,
        ),
        "training.evalEverySteps",
        True,
    ),
    ("early-stopping-zero-patience", spec("training", {"earlyStopping": {"patience": 0}}), "patience", True),
    # Inside the inline model config (preserve-unknown in the CRD): the API server accepts these;
    # `llmtrain validate` and the operator refuse them before anything is created.
    ("config-without-model-type", inline_config(model_type=None), "model.config.model_type", False),
    ("config-heads-do-not-divide", inline_config(hidden_size=66), "model.config.hidden_size", False),
    ("config-kv-heads", inline_config(num_key_value_heads=3), "model.config.num_key_value_heads", False),
    ("config-zero-layers", inline_config(num_hidden_layers=0), "model.config.num_hidden_layers", False),
    ("config-size-as-string", inline_config(vocab_size="384"), "model.config.vocab_size", False),
    (
        "sequence-longer-than-the-positions",
        with_path(inline_config(max_position_embeddings=512), "spec.dataset.maxSeqLength", 1024),
        "dataset.maxSeqLength",
        False,
    ),
    (
        "sequence-longer-than-gpt2-positions",
        with_path(
            inline_config(model_type="gpt2", n_positions=256, num_key_value_heads=None),
            "spec.dataset.maxSeqLength",
            512,
        ),
        "dataset.maxSeqLength",
        False,
    ),
]


def test_table_is_large_and_distinct() -> None:
    assert len(BAD) >= 30
    assert len({b[0] for b in BAD}) == len(BAD)
    assert len({yaml.safe_dump(b[1]) for b in BAD}) == len(BAD)


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("doc", "field"), [(b[1], b[2]) for b in BAD], ids=[b[0] for b in BAD])
def test_llmtrain_validate_rejects_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any], field: str
) -> None:
    code = main(["validate", str(_write(tmp_path, doc))])
    err = capsys.readouterr().err
    assert code == 1
    assert field in err, err
    # One line per problem, each naming the file.
    assert all(line.startswith(str(tmp_path)) for line in err.strip().splitlines())


def cel_messages(doc: dict[str, Any]) -> list[str]:
    """The CEL rule messages the CRD refuses `doc` with (none when its schema refuses it first:
    the API server evaluates CEL only on a structurally valid object)."""
    schema = openapi_schema()
    try:
        validate_strict(doc, schema)
    except jsonschema.ValidationError:
        return []
    return [v.message for v in cel.violations(schema, _with_defaults(schema, copy.deepcopy(doc)))]


@pytest.mark.thorough  # every bad spec through the CEL engine again: seconds
def test_every_rule_but_transition_rules_has_a_bad_spec() -> None:
    """The cluster tier compares both CEL engines on this corpus; transition rules (old values)
    have their own real updates there."""

    def entries(schema: dict[str, Any]) -> list[dict[str, str]]:
        out = list(schema.get("x-kubernetes-validations", []))
        subs = [*schema.get("properties", {}).values(), *([schema["items"]] if "items" in schema else [])]
        for sub in subs:
            out += entries(sub)
        return out

    messages = {e["message"] for e in entries(openapi_schema()) if "oldSelf" not in e["rule"]}
    refused = {m for b in BAD if b[3] for m in cel_messages(b[1])}
    assert messages <= refused, f"no bad spec for: {messages - refused}"


def _crd_rejects(doc: dict[str, Any]) -> bool:
    """What the API server would do: structural schema (strict fields, defaults applied), then CEL."""
    schema = openapi_schema()
    try:
        validate_strict(doc, schema)
    except jsonschema.ValidationError:
        return True
    return bool(cel.violations(schema, _with_defaults(schema, copy.deepcopy(doc))))


def _with_defaults(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _with_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [_with_defaults(schema["items"], v) for v in value]
    return value


@pytest.mark.parametrize("doc", [b[1] for b in BAD if b[3]], ids=[b[0] for b in BAD if b[3]])
def test_crd_schema_or_cel_rejects(doc: dict[str, Any]) -> None:
    assert _crd_rejects(doc)


@pytest.mark.parametrize("doc", [b[1] for b in BAD if not b[3]], ids=[b[0] for b in BAD if not b[3]])
def test_what_the_crd_cannot_see_it_accepts(doc: dict[str, Any]) -> None:
    """These reach the operator, which must refuse them itself (tests/cluster/test_reconcile.py)."""
    assert not _crd_rejects(doc)


def test_valid_base_passes_both(tmp_path: Path) -> None:
    assert not _crd_rejects(BASE)
    assert main(["validate", str(_write(tmp_path, BASE))]) == 0


# ---- what the API server accepts, validate accepts too ----------------------------------------
# (spec path, value): applied by tests/cluster/test_admission.py to the real API server as well.
ACCEPTED: list[tuple[str, Any]] = [
    # A whole-number float in an integer field: kube-openapi's type check takes it (stored as an
    # integer), where JSON Schema draft 4 (the offline `_crd_rejects`) does not.
    ("resources.workers", 2.0),
    ("training.epochs", 3.0),
    ("training.learningRate", 1),  # an integer in a number field
    ("resources.cpu", "4"),  # exactly half a core for each of the 8 GPU processes
    ("resources.memory", "+64Gi"),
    ("resources.head.cpu", "500m"),
    # Object-store URIs with the store's Secret references.
    (
        "objectStorage",
        {
            "endpoint": "http://s3.storage.svc:7070",
            "accessKeySecretRef": {"name": "s3", "key": "id"},
            "secretKeySecretRef": {"name": "s3", "key": "secret"},
        },
    ),
    # Every tracker, credentials from Secrets; credential-looking names with a Secret or no value.
    (
        "tracking",
        {
            "runName": "r",
            "mlflow": {
                "trackingUri": "https://mlflow.example:5000/x",
                "tokenSecretRef": {"name": "m", "key": "t"},
            },
            "wandb": {
                "project": "p",
                "entity": "e",
                "mode": "offline",
                "apiKeySecretRef": {"name": "w", "key": "k"},
            },
            "tensorboard": {},
        },
    ),
    (
        "network.env",
        [
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "w", "key": "k"}}},
            {"name": "HF_TOKEN"},
            {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        ],
    ),
]


def accepted_doc(path: str, value: Any) -> dict[str, Any]:
    return with_path(spec("resources.gpusPerWorker", 8), f"spec.{path}", value)


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[p for p, _ in ACCEPTED])
def test_what_the_api_server_accepts_validate_accepts(tmp_path: Path, path: str, value: Any) -> None:
    doc = accepted_doc(path, value)
    if not isinstance(value, float):
        assert not _crd_rejects(doc)
    assert main(["validate", str(_write(tmp_path, doc))]) == 0


def test_yaml_numbers_and_booleans_are_typed_as_kubectl_types_them(tmp_path: Path) -> None:
    """kubectl reads `2e-5` as a number and `y` as a boolean (go-yaml v2), PyYAML reads both as
    strings; the strict parse must see kubectl's types, or it would refuse a file the server takes."""
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(BASE, sort_keys=False)
        + "  training:\n    learningRate: 2e-5\n    gradientCheckpointing: y\n"
        + "  checkpoint:\n    everySteps: 1_000\n"
    )
    assert main(["validate", str(path)]) == 0
    job = parse_job(next(manifest_yaml.load_all(path.read_text())))
    assert job.spec.training.learning_rate == 2e-5
    assert job.spec.training.gradient_checkpointing is True
    assert job.spec.checkpoint.every_steps == 1000


def test_quoted_yes_is_refused_naming_the_field_and_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + '  runPolicy:\n    suspend: "yes"\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.runPolicy.suspend" in err and "boolean" in err, err


# ---- cpu for every GPU process -----------------------------------------------------------------
def test_the_cpu_refusal_names_the_minimum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = spec("resources", {"cpu": "1", "gpusPerWorker": 8})
    assert main(["validate", str(_write(tmp_path, doc))]) == 1
    assert "set resources.cpu to at least 4 " in capsys.readouterr().err
    doc = spec("resources", {"cpu": "1", "gpusPerWorker": 3})
    assert main(["validate", str(_write(tmp_path, doc))]) == 1
    assert "at least 1.5 " in capsys.readouterr().err


@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 6, 7, 8, 16])
def test_every_accepted_cpu_lets_ray_place_every_process(gpus: int) -> None:
    """What the spec accepts, Ray can place: the processes' CPU reservations, in Ray's resource
    units, add up to at most the ceil(cpu) CPUs KubeRay gives the worker's Ray node."""
    accepted = 0
    for cpu in ["100m", "500m", "900m", "1", "1.5", "2", "3", "3500m", "4", "5", "7", "8", "12", "13", "100"]:
        try:
            job = parse_job(spec("resources", {"cpu": cpu, "gpusPerWorker": gpus}))
        except InvalidJob as exc:
            assert gpus and cpu_cores(cpu) < 0.5 * gpus, exc
            continue
        accepted += 1
        per_process = cluster_trainer_config(job).scaling.cpus_per_worker
        assert per_process >= 0.5
        ray_cpus = math.ceil(cpu_cores(cpu))
        assert int(per_process * 10_000) * max(gpus, 1) <= ray_cpus * 10_000, (cpu, gpus)
        # ... and no more: one more process (another pod's) must not fit on this pod's Ray node.
        assert per_process * (max(gpus, 1) + 1) > ray_cpus, (cpu, gpus, per_process)
    assert accepted


# ---- the sequence and the model's positions ----------------------------------------------------
def test_a_sequence_as_long_as_the_positions_is_accepted() -> None:
    doc = with_path(inline_config(max_position_embeddings=1024), "spec.dataset.maxSeqLength", 1024)
    assert parse_job(doc).spec.dataset.max_seq_length == 1024
    # Without stated positions (transformers' per-model default), nothing is judged.
    parse_job(with_path(inline_config(), "spec.dataset.maxSeqLength", 65536))


# ---- a malformed quantity: the field and an example, not the pattern ------------------------------
@pytest.mark.parametrize(
    ("path", "value", "field", "example"),
    [
        ("resources.memory", "2GB", "resources.memory", "64Gi"),
        ("resources.cpu", "two", "resources.cpu", "8"),
        ("resources.head.memory", "8 Gi", "resources.head.memory", "8Gi"),
        ("storage", {"create": {"size": "500gb"}}, "storage.create.size", "500Gi"),
    ],
)
def test_a_malformed_quantity_is_told_its_field_and_an_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, value: Any, field: str, example: str
) -> None:
    """`llmtrain validate` (pydantic) and the CRD (CEL, what `kubectl apply` shows) say the same
    thing; the cluster tier checks the real API server's answer on the corpus above."""
    doc = spec(path, value)
    assert main(["validate", str(_write(tmp_path, doc))]) == 1
    err = capsys.readouterr().err.strip()
    message = f"{field} must be a Kubernetes quantity: use e.g. {example} ("
    assert len(err.splitlines()) == 1 and message in err, err
    assert "[0-9]" not in err  # no regex
    crd = cel_messages(doc)
    assert len(crd) == 1 and crd[0].startswith(message) and crd[0] in err, crd


def test_the_inline_config_problems_say_what_is_wrong_and_how_to_fix_it() -> None:
    """The messages `llmtrain validate` and the operator print for an inline model config, word
    for word (the table above pins only the field each names)."""
    assert config_problems({"hidden_size": 66, "num_attention_heads": 4, "num_key_value_heads": 3}) == [
        (
            ".spec.model.config.model_type",
            "required: the Hugging Face architecture name (e.g. llama, qwen2, mistral) that selects "
            "the model class",
        ),
        (
            ".spec.model.config.hidden_size",
            "hidden_size 66 is not divisible by num_attention_heads 4; change one of them or set head_dim",
        ),
        (
            ".spec.model.config.num_key_value_heads",
            "num_attention_heads 4 is not a multiple of num_key_value_heads 3: each key/value head serves "
            "a whole group of query heads",
        ),
    ]
    # With head_dim set, the heads need not divide hidden_size (the attention projects to heads * head_dim).
    assert (
        config_problems({"model_type": "llama", "hidden_size": 66, "num_attention_heads": 4, "head_dim": 16})
        == []
    )
    # A model with a single position cannot train on two.
    ((path, message),) = sequence_problems({"max_position_embeddings": 1}, 2)
    assert (path, message.split(":")[0]) == (
        ".spec.dataset.maxSeqLength",
        "dataset.maxSeqLength 2 is longer than model.config.max_position_embeddings 1",
    )

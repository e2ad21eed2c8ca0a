"""Every CEL rule of the CRD evaluated on a passing and a failing value by the product's engine
(`common-expression-language`, Rust), which `llmtrain validate` and the operator use. The second,
independent engine is the real API server's cel-go: tests/cluster/test_admission.py checks that it
refuses every bad spec of the corpus with the same rule messages.

The table is keyed by rule text: a rule added to the models without an entry here fails the
coverage test, so no rule ships untested.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.api.base import (
    POSITIVE_QUANTITY_RULE,
    QUANTITY_PATTERN,
    QUANTITY_RULE,
    cel,
    immutable,
    metadata_keys_rule,
    positive_quantity,
)
from llmtrain.api.cel import evaluate_rule, violations
from llmtrain.api.crd import openapi_schema
from llmtrain.api.spec import _object_uri_rules

SELF_EQ = "self == oldSelf"

# rule -> (value that passes, value that fails[, old value for transition rules])
CASES: dict[str, list[tuple[Any, Any, Any]]] = {
    "has(self.name) != has(self.config)": [
        ({"name": "m"}, {"name": "m", "config": {"model_type": "llama"}}, None),
        ({"config": {}}, {}, None),
    ],
    "!has(self.config) || has(self.tokenizer)": [
        ({"config": {}, "tokenizer": "byte-level"}, {"config": {}}, None),
    ],
    "has(self.name) != has(self.path)": [({"path": "/d"}, {"name": "x", "path": "/d"}, None)],
    "!has(self.lora) || self.type == 'lora'": [
        ({"type": "lora", "lora": {}}, {"type": "full", "lora": {}}, None),
    ],
    "!self.offloadParams || self.zeroStage == 3": [
        ({"offloadParams": True, "zeroStage": 3}, {"offloadParams": True, "zeroStage": 2}, None),
    ],
    "!has(self.deepspeed) || self.type == 'deepspeed'": [
        ({"type": "deepspeed", "deepspeed": {}}, {"type": "fsdp", "deepspeed": {}}, None),
    ],
    "!has(self.fsdp) || self.type == 'fsdp'": [
        ({"type": "fsdp", "fsdp": {}}, {"type": "ddp", "fsdp": {}}, None)
    ],
    "has(self.claimName) != has(self.create)": [
        ({"claimName": "c"}, {"claimName": "c", "create": {"size": "1Gi"}}, None),
        ({"create": {"size": "1Gi"}}, {"mountPath": "/x"}, None),
    ],
    "!self.name.startsWith('LLMTRAIN_')": [({"name": "NCCL_DEBUG"}, {"name": "LLMTRAIN_X"}, None)],
    "has(self.queueName) == has(oldSelf.queueName)": [
        ({"queueName": "q"}, {}, {"queueName": "q"}),
    ],
    "has(self.workloadPriorityClass) == has(oldSelf.workloadPriorityClass)": [
        ({"workloadPriorityClass": "b"}, {}, {"workloadPriorityClass": "a"}),
        ({}, {"workloadPriorityClass": "a"}, {}),
    ],
    "has(self.required) != has(self.preferred)": [
        ({"required": "topology.kubernetes.io/zone"}, {}, None),
        ({"preferred": "kubernetes.io/hostname"}, {"required": "a", "preferred": "b"}, None),
    ],
    "self.training.precision != 'fp16' || self.resources.gpusPerWorker > 0": [
        (
            {"training": {"precision": "fp16"}, "resources": {"gpusPerWorker": 1}},
            {"training": {"precision": "fp16"}, "resources": {"gpusPerWorker": 0}},
            None,
        ),
    ],
    "self.strategy.type != 'deepspeed' || !has(self.strategy.deepspeed) || "
    "!self.strategy.deepspeed.offloadOptimizer || self.resources.gpusPerWorker > 0": [
        (
            {
                "strategy": {"type": "deepspeed", "deepspeed": {"offloadOptimizer": True}},
                "resources": {"gpusPerWorker": 8},
            },
            {
                "strategy": {"type": "deepspeed", "deepspeed": {"offloadOptimizer": True}},
                "resources": {"gpusPerWorker": 0},
            },
            None,
        ),
    ],
    "!has(self.strategy.fsdp) || !has(self.strategy.fsdp.hybridShardSize) || "
    "(self.resources.gpusPerWorker > 0 ? self.resources.workers * "
    "self.resources.gpusPerWorker : self.resources.workers) % "
    "self.strategy.fsdp.hybridShardSize == 0": [
        (
            {"strategy": {"fsdp": {"hybridShardSize": 8}}, "resources": {"workers": 2, "gpusPerWorker": 8}},
            {"strategy": {"fsdp": {"hybridShardSize": 3}}, "resources": {"workers": 2, "gpusPerWorker": 8}},
            None,
        ),
        (
            {"strategy": {"fsdp": {"hybridShardSize": 2}}, "resources": {"workers": 4, "gpusPerWorker": 0}},
            {"strategy": {"fsdp": {"hybridShardSize": 3}}, "resources": {"workers": 4, "gpusPerWorker": 0}},
            None,
        ),
    ],
    "!has(self.trainer.type) || self.trainer.type != 'huggingface' || "
    "!has(self.strategy.type) || self.strategy.type != 'fsdp' || "
    "self.resources.gpusPerWorker > 0": [
        (
            {
                "trainer": {"type": "huggingface"},
                "strategy": {"type": "ddp"},
                "resources": {"gpusPerWorker": 0},
            },
            {
                "trainer": {"type": "huggingface"},
                "strategy": {"type": "fsdp"},
                "resources": {"gpusPerWorker": 0},
            },
            None,
        ),
        (
            {
                "trainer": {"type": "huggingface"},
                "strategy": {"type": "fsdp"},
                "resources": {"gpusPerWorker": 8},
            },
            {
                "trainer": {"type": "huggingface"},
                "strategy": {"type": "fsdp"},
                "resources": {"gpusPerWorker": 0},
            },
            None,
        ),
    ],
    "!has(self.resumeFrom) || !has(self.resumeFrom.checkpoint) || "
    "!has(self.trainer.type) || self.trainer.type != 'huggingface'": [
        (
            {"trainer": {"type": "huggingface"}, "resumeFrom": {"run": "old/uid"}},
            {"trainer": {"type": "huggingface"}, "resumeFrom": {"checkpoint": "seeds/a"}},
            None,
        ),
        (
            {"trainer": {"type": "custom"}, "resumeFrom": {"checkpoint": "seeds/a"}},
            {"trainer": {"type": "huggingface"}, "resumeFrom": {"checkpoint": "seeds/a"}},
            None,
        ),
        (
            {"trainer": {}, "resumeFrom": {"checkpoint": "seeds/a"}},
            {"trainer": {"type": "huggingface"}, "resumeFrom": {"checkpoint": "seeds/a"}},
            None,
        ),
    ],
    "self.metadata.name.size() <= 47": [
        ({"metadata": {"name": "a" * 47}}, {"metadata": {"name": "a" * 48}}, None)
    ],
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": [
        ({"metadata": {"name": "job-1"}}, {"metadata": {"name": "Job_1"}}, None),
    ],
    SELF_EQ: [({"rank": 8}, {"rank": 16}, {"rank": 8})],
    "has(self.run) != has(self.checkpoint)": [
        ({"run": "old/uid"}, {"run": "old/uid", "checkpoint": "seeds/a"}, None),
        ({"checkpoint": "seeds/a"}, {}, None),
    ],
    "!has(self.checkpoint) || !self.checkpoint.matches('(^|/)[.][.](/|$)')": [
        ({"checkpoint": "seeds/a..b/c"}, {"checkpoint": "../seeds"}, None),
        ({"checkpoint": "/mnt/llmtrain/..x"}, {"checkpoint": "runs/../../etc"}, None),
        ({"run": "a/b"}, {"checkpoint": "runs/.."}, None),
    ],
    "has(self.resumeFrom) == has(oldSelf.resumeFrom)": [
        ({"resumeFrom": {"run": "a/b"}}, {}, {"resumeFrom": {"run": "a/b"}}),
        ({}, {"resumeFrom": {"run": "a/b"}}, {}),
    ],
}


def _rule(message_start: str) -> str:
    """The rule text of the CRD rule whose message starts so (generated rules, long texts)."""

    def entries(schema: dict[str, Any]) -> Iterator[dict[str, str]]:
        yield from schema.get("x-kubernetes-validations", [])
        for sub in [
            *schema.get("properties", {}).values(),
            *([schema["items"]] if "items" in schema else []),
        ]:
            yield from entries(sub)

    return next(e["rule"] for e in entries(openapi_schema()) if e["message"].startswith(message_start))


_MOUNT = {"name": "x", "mountPath": "/data"}
_CUSTOM = {"function": "m:f"}
CASES.update(
    {
        "!has(self.huggingface) || self.type == 'huggingface'": [
            ({"type": "huggingface", "huggingface": {}}, {"type": "builtin", "huggingface": {}}, None),
        ],
        "has(self.custom) == (has(self.type) && self.type == 'custom')": [
            ({"type": "custom", "custom": _CUSTOM}, {"type": "custom"}, None),
            ({"type": "builtin"}, {"type": "huggingface", "custom": _CUSTOM}, None),
            ({}, {"custom": _CUSTOM}, None),  # the field's default as the API server checks it
        ],
        _rule("each podTemplate.volumes entry needs exactly one source"): [
            ({"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}, "secret": {}}, None),
            ({"name": "x", "csi": {"driver": "d"}}, {"name": "x"}, None),
        ],
        _rule("podTemplate.volumes names shared-storage"): [
            ({"name": "data"}, {"name": "trainer-config"}, None),
        ],
        _rule("podTemplate.volumeMounts cannot use"): [
            ({"mountPath": "/data"}, {"mountPath": "/dev/shm"}, None),
            ({"mountPath": "/etc/llmtrain-extra"}, {"mountPath": "/etc/llmtrain/x"}, None),
        ],
        _rule("every podTemplate.volumeMounts name"): [
            ({"volumes": [{"name": "x"}], "volumeMounts": [_MOUNT]}, {"volumeMounts": [_MOUNT]}, None),
            ({}, {"volumes": [{"name": "y"}], "volumeMounts": [_MOUNT]}, None),
        ],
        _rule("podTemplate.volumes names must be unique"): [
            ({"volumes": [{"name": "x"}, {"name": "y"}]}, {"volumes": [{"name": "x"}, {"name": "x"}]}, None),
        ],
        _rule("podTemplate.labels keys must be valid"): [
            ({"team": "a", "example.com/cost-center": "1"}, {"a/b/c": "x"}, None),
            ({"a" * 63: "x"}, {"a" * 64: "x"}, None),
        ],
        _rule("podTemplate.labels keys under"): [
            ({"example.com/x": "1"}, {"ray.io/node-type": "worker"}, None),
        ],
        _rule("dataset.path cannot contain a '..' segment"): [
            ({"path": "data/a..b.jsonl"}, {"path": "data/../x"}, None),
            ({"name": "d"}, {"path": ".."}, None),
        ],
        _rule("dataset.validationPath cannot contain a '..' segment"): [
            ({"validationPath": "val/a..b.jsonl"}, {"validationPath": "val/../x"}, None),
            ({"path": "d"}, {"validationPath": ".."}, None),
        ],
        _rule("set only one of dataset.validationPath"): [
            (
                {"validationPath": "val.jsonl", "validationSplit": 0.0},
                {"validationPath": "val.jsonl", "validationSplit": 0.05},
                None,
            ),
            ({"validationSplit": 0.1}, {"validationSplit": 0.1, "validationPath": "v"}, None),
            ({"validationPath": "v"}, {"validationSplit": 0.5, "validationPath": "s3://b/v"}, None),
        ],
        _rule("resources.tolerations: operator Exists"): [
            ({"operator": "Exists"}, {"operator": "Exists", "value": "v"}, None),
            ({"operator": "Equal", "value": "v"}, {"operator": "Exists", "value": "x"}, None),
        ],
        _rule("resources.gpuResourceName must end in 'gpu'"): [
            (
                {"gpusPerWorker": 1, "gpuResourceName": "amd.com/gpu"},
                {"gpusPerWorker": 1, "gpuResourceName": "x.io/tpu"},
                None,
            ),
            (
                {"gpusPerWorker": 1, "gpuResourceName": "nvidia.com/mig-2g.32gb"},
                {"gpusPerWorker": 1, "gpuResourceName": "nvidia.com/mig-2g"},
                None,
            ),
            (
                {"gpusPerWorker": 0, "gpuResourceName": "x.io/tpu"},
                {"gpusPerWorker": 2, "gpuResourceName": "cpu"},
                None,
            ),
        ],
        _rule("resources.rayVersion is the Ray version of resources.image"): [
            ({"image": "r/t:1", "rayVersion": "2.60.0"}, {"rayVersion": "2.60.0"}, None),
            ({"image": "r/t:1"}, {"cpu": "1", "rayVersion": "2.52.0"}, None),
        ],
        _rule("resources.rayVersion must be the image's Ray release"): [
            ({"image": "r/t:1", "rayVersion": "2.52.0"}, {"image": "r/t:1", "rayVersion": "2.51.9"}, None),
            ({"image": "r/t:1", "rayVersion": "2.100.3"}, {"image": "r/t:1", "rayVersion": "2.5.0"}, None),
            ({"image": "r/t:1", "rayVersion": "3.0.0"}, {"image": "r/t:1", "rayVersion": "1.99.0"}, None),
            ({"image": "r/t:1", "rayVersion": "10.1.0"}, {"image": "r/t:1", "rayVersion": "2.60"}, None),
            ({"image": "r/t:1"}, {"image": "r/t:1", "rayVersion": "2.60.0-rc1"}, None),
        ],
        _rule("resources.nodeSelector keys must be valid"): [({"pool": "a"}, {"bad key": "a"}, None)],
        _rule("storage.mountPath cannot be"): [
            ({"mountPath": "/mnt/data"}, {"mountPath": "/dev/shm"}, None),
            ({"mountPath": "/etc/llmtrain-data"}, {"mountPath": "/etc/llmtrain/x"}, None),
            ({}, {"mountPath": "/"}, None),
        ],
        _rule("storage.create.accessModes must include ReadWriteMany"): [
            (
                {"create": {"accessModes": ["ReadWriteMany", "ReadWriteOnce"]}},
                {"create": {"accessModes": ["ReadWriteOnce"]}},
                None,
            ),
        ],
        _rule("network.env cannot set RAY_REDIS_ADDRESS"): [
            ({"name": "NCCL_DEBUG"}, {"name": "REDIS_PASSWORD"}, None),
        ],
        _rule("network.env takes value or valueFrom, not both"): [
            (
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "X", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                None,
            ),
        ],
        _rule("network.env names that look like a credential"): [
            (
                {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
                {"name": "HF_TOKEN", "value": "hf_x"},
                None,
            ),
            (
                {"name": "MLFLOW_TRACKING_USERNAME", "value": "me"},
                {"name": "mlflow_tracking_password", "value": "p"},
                None,
            ),
            (
                {"name": "AWS_ACCESS_KEY_ID", "value": ""},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "k"},
                None,
            ),
            ({"name": "WANDB_API_KEY"}, {"name": "WANDB_API_KEY", "value": "k"}, None),
        ],
        _rule("tracking needs at least one of"): [({"tensorboard": {}}, {"runName": "r"}, None)],
        _rule("network.env cannot turn on RAY_enable_autoscaler_v2"): [
            (
                {"name": "RAY_enable_autoscaler_v2", "value": "0"},
                {"name": "RAY_enable_autoscaler_v2", "value": "true"},
                None,
            ),
        ],
        _rule("resumeFrom.checkpoint must lie on the shared storage"): [
            (
                {"storage": {}, "resumeFrom": {"checkpoint": "/mnt/llmtrain/seeds/a"}},
                {"storage": {}, "resumeFrom": {"checkpoint": "/mnt/llmtrainer/seeds/a"}},
                None,
            ),
            (
                {"storage": {"mountPath": "/data"}, "resumeFrom": {"checkpoint": "seeds/a"}},
                {"storage": {"mountPath": "/data"}, "resumeFrom": {"checkpoint": "/mnt/llmtrain/a"}},
                None,
            ),
            (
                {"storage": {}, "resumeFrom": {"run": "a/b"}},
                {"storage": {}, "resumeFrom": {"checkpoint": "/a"}},
                None,
            ),
        ],
        _rule("network.fabric (RDMA devices"): [
            (
                {"ncclProfile": "efa", "fabric": {"perWorker": 4}},
                {"ncclProfile": "auto", "fabric": {"perWorker": 4}},
                None,
            ),
            ({"ncclProfile": "ethernet"}, {"ncclProfile": "nvlink", "fabric": {}}, None),
            ({"ncclProfile": "infiniband", "fabric": {}}, {"ncclProfile": "ethernet", "fabric": {}}, None),
        ],
        _rule("network.stepTimeoutSeconds must not exceed"): [
            (
                {"collectiveTimeoutSeconds": 1800, "stepTimeoutSeconds": 600},
                {"collectiveTimeoutSeconds": 600, "stepTimeoutSeconds": 601},
                None,
            ),
            (
                {"collectiveTimeoutSeconds": 600, "stepTimeoutSeconds": 600},
                {"collectiveTimeoutSeconds": 60, "stepTimeoutSeconds": 3600},
                None,
            ),
            (
                {"collectiveTimeoutSeconds": 1800},
                {"collectiveTimeoutSeconds": 100, "stepTimeoutSeconds": 200},
                None,
            ),
        ],
        _rule("network.ncclProfile infiniband and efa need GPUs"): [
            (
                {"network": {"ncclProfile": "infiniband"}, "resources": {"gpusPerWorker": 8}},
                {"network": {"ncclProfile": "infiniband"}, "resources": {"gpusPerWorker": 0}},
                None,
            ),
            (
                {"network": {"ncclProfile": "ethernet"}, "resources": {"gpusPerWorker": 0}},
                {"network": {"ncclProfile": "efa"}, "resources": {"gpusPerWorker": 0}},
                None,
            ),
        ],
        _rule("podTemplate.volumeMounts cannot mount at or under storage.mountPath"): [
            (
                {
                    "storage": {"mountPath": "/mnt/a"},
                    "podTemplate": {"volumeMounts": [{"mountPath": "/mnt/ab"}]},
                },
                {
                    "storage": {"mountPath": "/mnt/a"},
                    "podTemplate": {"volumeMounts": [{"mountPath": "/mnt/a/b"}]},
                },
                None,
            ),
        ],
    }
)

# Every quantity the pattern accepts, judged by its sign and mantissa: zero in any spelling
# (suffix, exponent, decimals) and any negative fails; the smallest positive spellings pass.
CASES[POSITIVE_QUANTITY_RULE] = [
    ("1", "0", None),
    ("500m", "0m", None),
    ("0.5", "0.0", None),
    (".5", "-.5", None),
    ("64Gi", "0Gi", None),
    ("+2", "-2", None),
    ("1e3", "0e3", None),
    ("0.0001", "00", None),
    ("10", "-10Gi", None),
]
# A malformed quantity is QUANTITY_RULE's alone: the positivity rule lets it pass, so the API server
# answers "two" with one message.
CASES[POSITIVE_QUANTITY_RULE] += [("two", "-0", None), ("2GB", "0Gi", None)]
CASES[QUANTITY_RULE] = [
    ("64Gi", "64GB", None),
    ("500m", "two", None),
    ("1e3", "8 Gi", None),
    (".5", "1.5.0", None),
    ("+2", "Gi", None),
    ("2G", "2gi", None),
    ("-1", "", None),  # the sign is the positivity rule's business
]
CASES[_rule("network.env names must be unique")] = [
    ({"env": [{"name": "A"}, {"name": "B"}]}, {"env": [{"name": "A"}, {"name": "B"}, {"name": "A"}]}, None),
    ({}, {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "1"}]}, None),
]

CASES[_rule("training.checkpointEveryBlocks only applies")] = [
    ({"gradientCheckpointing": True, "checkpointEveryBlocks": 2}, {"checkpointEveryBlocks": 2}, None),
    ({"checkpointEveryBlocks": 1}, {"gradientCheckpointing": False, "checkpointEveryBlocks": 3}, None),
]


# Evaluation-driven settings (spec-level rules): they rank or stop by validation loss, so they need
# a validation split.
CASES[_rule("training.earlyStopping needs an evaluation")] = [
    (
        {"training": {"earlyStopping": {"patience": 2}}, "dataset": {"validationSplit": 0.05}},
        {"training": {"earlyStopping": {"patience": 2}}, "dataset": {}},
        None,
    ),
    (
        {"training": {"earlyStopping": {"patience": 2}}, "dataset": {"validationPath": "val.jsonl"}},
        {"training": {"earlyStopping": {"patience": 2}}, "dataset": {"validationSplit": 0.0}},
        None,
    ),
    (
        {"training": {}, "dataset": {"validationSplit": 0.0}},
        {"training": {"earlyStopping": {"patience": 1}}, "dataset": {"validationSplit": 0.0}},
        None,
    ),
]
CASES[_rule("checkpoint.keepBest and checkpoint.exportBest rank checkpoints by validation loss")] = [
    (
        {"checkpoint": {"exportBest": True}, "dataset": {"validationSplit": 0.1}},
        {"checkpoint": {"exportBest": True}, "dataset": {}},
        None,
    ),
    (
        {"checkpoint": {"keepBest": False}, "dataset": {}},
        {"checkpoint": {"keepBest": True}, "dataset": {"validationSplit": 0.0}},
        None,
    ),
    (
        {"checkpoint": {"keepBest": True}, "dataset": {"validationPath": "v"}},
        {"checkpoint": {"keepBest": True}, "dataset": {"path": "v"}},
        None,
    ),
]
CASES[_rule("training.evalEverySteps needs an evaluation")] = [
    (
        {"training": {"evalEverySteps": 10}, "dataset": {"validationPath": "v"}},
        {"training": {"evalEverySteps": 10}, "dataset": {"validationSplit": 0.0}},
        None,
    ),
    (
        {"training": {"evalEverySteps": 10}, "dataset": {"validationSplit": 0.1}},
        {"training": {"evalEverySteps": 10}, "dataset": {}},
        None,
    ),
]
# Only evaluations at a checkpoint's step rank checkpoints: each checkpoint step must be an
# evaluation step (checkpoint.everySteps defaults to 500).
CASES[_rule("checkpoint.keepBest and checkpoint.exportBest rank checkpoints by the evaluation")] = [
    (
        {"training": {"evalEverySteps": 25}, "checkpoint": {"keepBest": True, "everySteps": 100}},
        {"training": {"evalEverySteps": 30}, "checkpoint": {"keepBest": True, "everySteps": 100}},
        None,
    ),
    (
        {"training": {"evalEverySteps": 250}, "checkpoint": {"exportBest": True}},
        {"training": {"evalEverySteps": 300}, "checkpoint": {"exportBest": True}},
        None,
    ),
    (
        {"training": {"evalEverySteps": 30}, "checkpoint": {"everySteps": 100}},
        {"training": {"evalEverySteps": 1000}, "checkpoint": {"keepBest": True, "exportBest": False}},
        None,
    ),
    (
        {"training": {}, "checkpoint": {"keepBest": True, "everySteps": 7}},
        {"training": {"evalEverySteps": 2}, "checkpoint": {"keepBest": True, "everySteps": 7}},
        None,
    ),
]


# Object-store URIs (spec-level rules): a '://' value must be a well-formed object URI, and an
# s3://, gs:// or az:// one needs that store's Secret references in spec.objectStorage.
_STORE = {"accessKeySecretRef": {"name": "s", "key": "a"}, "secretKeySecretRef": {"name": "s", "key": "b"}}
_GCS = {"gcs": {"credentialsSecretRef": {"name": "g", "key": "key.json"}}}
_AZURE = {"azure": {"accountName": "acct", "accountKeySecretRef": {"name": "a", "key": "key"}}}
for _field, _wrap in [
    ("dataset.path", lambda v: {"dataset": {"path": v}, "model": {}, "checkpoint": {}}),
    ("dataset.validationPath", lambda v: {"dataset": {"validationPath": v}, "model": {}, "checkpoint": {}}),
    ("model.name", lambda v: {"model": {"name": v}, "dataset": {}, "checkpoint": {}}),
    (
        "resumeFrom.checkpoint",
        lambda v: {"resumeFrom": {"checkpoint": v}, "model": {}, "dataset": {}, "checkpoint": {}},
    ),
]:
    CASES[_rule(f"{_field}: an object URI is")] = [
        (_wrap("s3://corpus/a/b.txt"), _wrap("s3://Corpus/a"), None),
        (_wrap("data/a.txt"), _wrap("http://host/a"), None),
        (_wrap("gs://my-bucket"), _wrap("s3://x/a"), None),
    ]
for _field, _wrap in [
    ("dataset.path", lambda v: {"dataset": {"path": v}, "model": {}, "checkpoint": {}}),
    ("dataset.validationPath", lambda v: {"dataset": {"validationPath": v}, "model": {}, "checkpoint": {}}),
    ("model.name", lambda v: {"model": {"name": v}, "dataset": {}, "checkpoint": {}}),
    (
        "resumeFrom.checkpoint",
        lambda v: {"resumeFrom": {"checkpoint": v}, "model": {}, "dataset": {}, "checkpoint": {}},
    ),
    ("checkpoint.exportTo", lambda v: {"checkpoint": {"exportTo": v}, "model": {}, "dataset": {}}),
]:
    CASES[_rule(f"{_field} is an s3:// URI")] = [
        ({**_wrap("s3://corpus/a"), "objectStorage": _STORE}, _wrap("s3://corpus/a"), None),
        (_wrap("gs://corpus/a"), {**_wrap("s3://corpus/a"), "objectStorage": _GCS}, None),
    ]
    CASES[_rule(f"{_field} is a gs:// URI")] = [
        ({**_wrap("gs://corpus/a"), "objectStorage": _GCS}, _wrap("gs://corpus/a"), None),
        (_wrap("s3://corpus/a"), {**_wrap("gs://corpus/a"), "objectStorage": _STORE}, None),
    ]
    CASES[_rule(f"{_field} is an az:// URI")] = [
        ({**_wrap("az://corpus/a"), "objectStorage": _AZURE}, _wrap("az://corpus/a"), None),
        (_wrap("data/a.txt"), {**_wrap("az://corpus/a"), "objectStorage": _GCS}, None),
    ]
CASES[_rule("objectStorage.accessKeySecretRef and objectStorage.secretKeySecretRef go together")] = [
    (_STORE, {"accessKeySecretRef": {"name": "s", "key": "a"}}, None),
    (_GCS, {**_GCS, "secretKeySecretRef": {"name": "s", "key": "b"}}, None),
]
CASES[_rule("checkpoint.exportTo copies the export")] = [
    ({"export": True, "exportTo": "s3://m/a"}, {"export": False, "exportTo": "s3://m/a"}, None),
    ({"export": False}, {"export": False, "exportTo": "gs://m/a"}, None),
]
_HUB = {"repoId": "o/r", "tokenSecretRef": {"name": "hub", "key": "t"}}
CASES[_rule("checkpoint.pushToHub uploads the export")] = [
    ({"export": True, "pushToHub": _HUB}, {"export": False, "pushToHub": _HUB}, None),
    ({"pushToHub": _HUB}, {"export": False, "exportTo": "gs://m/a", "pushToHub": _HUB}, None),
]


def _rules(schema: dict[str, Any]) -> Iterator[str]:
    for entry in schema.get("x-kubernetes-validations", []):
        yield entry["rule"]
    for sub in schema.get("properties", {}).values():
        yield from _rules(sub)
    if "items" in schema:
        yield from _rules(schema["items"])


def test_every_rule_in_the_crd_has_cases() -> None:
    missing = set(_rules(openapi_schema())) - set(CASES)
    assert not missing, f"add passing/failing cases for {missing}"


def test_every_default_satisfies_its_own_rules_as_the_api_server_checks_it() -> None:
    """The API server refuses a CRD whose `default` fails (or cannot evaluate) a rule of its own
    field, and it checks the default as written, nested defaults not applied: a rule reading a
    defaulted key of `{}` needs has()."""

    def defaulted(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
        for name, sub in schema.get("properties", {}).items():
            if "default" in sub:
                yield f"{path}.{name}", sub, sub["default"]
            yield from defaulted(sub, f"{path}.{name}")
        if "items" in schema:
            yield from defaulted(schema["items"], f"{path}[]")

    checked = 0
    for where, sub, default in defaulted(openapi_schema(), ""):
        for entry in sub.get("x-kubernetes-validations", []):
            if "oldSelf" in entry["rule"]:
                continue
            assert evaluate_rule(entry["rule"], default), (where, entry["rule"], default)
            checked += 1
    assert checked, "no defaulted field with rules: the test checks nothing"


def test_every_rule_message_names_a_field() -> None:
    def entries(schema: dict[str, Any]) -> Iterator[dict[str, str]]:
        yield from schema.get("x-kubernetes-validations", [])
        for sub in schema.get("properties", {}).values():
            yield from entries(sub)
        if "items" in schema:
            yield from entries(schema["items"])

    for entry in entries(openapi_schema()):
        assert "." in entry["message"] or "metadata.name" in entry["message"], entry


@pytest.mark.parametrize(
    ("rule", "good", "bad", "old"),
    [(rule, g, b, o) for rule, cases in CASES.items() for g, b, o in cases],
)
def test_rule_passes_and_fails(rule: str, good: Any, bad: Any, old: Any) -> None:
    if old is None:
        assert evaluate_rule(rule, good)
        assert not evaluate_rule(rule, bad)
    else:
        assert evaluate_rule(rule, good, old)
        assert not evaluate_rule(rule, bad, old)


def test_integers_in_number_fields_are_doubles_as_the_api_server_types_them() -> None:
    schema = {
        "type": "object",
        "properties": {"lr": {"type": "number"}, "steps": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "type(self.lr) == double", "message": "lr"},
            {"rule": "type(self.steps) == int", "message": "steps"},
        ],
    }
    assert violations(schema, {"lr": 1, "steps": 2}) == []


def test_immutable_fields_and_mutable_ones() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    immutable = {
        k for k, v in spec.items() if SELF_EQ in [r["rule"] for r in v.get("x-kubernetes-validations", [])]
    }
    assert immutable == {
        "model",
        "dataset",
        "method",
        "strategy",
        "training",
        "checkpoint",
        "resumeFrom",
        "tracking",
        "trainer",
        "resources",
        "storage",
        "network",
        "podTemplate",
    }
    policy = spec["runPolicy"]["properties"]
    for mutable in ("suspend", "ttlSecondsAfterFinished", "activeDeadlineSeconds"):
        assert "x-kubernetes-validations" not in policy[mutable]
    for frozen in ("maxRetries", "maxWorkerFailures", "queueName", "workloadPriorityClass"):
        assert policy[frozen]["x-kubernetes-validations"][0]["rule"] == SELF_EQ


def test_the_hybrid_shard_rule_counts_the_training_processes_as_the_spec_does() -> None:
    """CEL spells the count in its own text; it must be ResourcesSpec.processes, which render, the
    memory estimate and `llmtrain run` use."""
    from llmtrain.api.spec import ResourcesSpec

    rule = _rule("strategy.fsdp.hybridShardSize must divide the training processes")
    for workers in (1, 2, 3, 5):
        for gpus in (0, 1, 2, 8):
            resources = ResourcesSpec(workers=workers, gpus_per_worker=gpus)
            for shard in range(1, 41):
                spec = {
                    "strategy": {"fsdp": {"hybridShardSize": shard}},
                    "resources": {"workers": workers, "gpusPerWorker": gpus},
                }
                assert evaluate_rule(rule, spec) == (resources.processes % shard == 0), (workers, gpus, shard)


# The API server's own OpenAPI pattern of resource.Quantity (k8s.io/apimachinery), as it spells it.
APISERVER_QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@pytest.mark.parametrize(
    "text",
    [
        "1",
        "+1",
        "-1",
        "1.",
        ".5",
        "1.5",
        "500m",
        "64Gi",
        "64GB",
        "64gi",
        "1e3",
        "1E-3",
        "1e",
        "1.5e+2",
        "2 Gi",
        "two",
        "",
        ".",
        "+",
        "1Ki",
        "1K",
        "1k",
        "1.5.0",
        "0x10",
        "1ei",
        "1Ei",
        "1Mi ",
        " 1",
    ],
)
def test_the_quantity_pattern_accepts_what_the_api_servers_pattern_accepts(text: str) -> None:
    """Rewritten without escapes (to sit in a CEL string), it means the same."""
    expected = re.match(APISERVER_QUANTITY_PATTERN, text) is not None
    assert (re.match(QUANTITY_PATTERN, text) is not None) is expected
    assert evaluate_rule(QUANTITY_RULE, text) is expected


def test_a_node_is_converted_to_cel_once_for_all_its_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec has ~30 rules: converting it for each was most of the operator's CPU per job. The
    shared conversion changes no verdict (the other tests here), only how often it is made."""
    from llmtrain.api import cel as cel_module

    from tests.support.jobs import minimal_job

    made: list[dict[str, Any]] = []
    real = cel_module.cel.Context

    def counting(*, variables: dict[str, Any]) -> Any:
        made.append(variables)
        return real(variables=variables)

    monkeypatch.setattr(cel_module.cel, "Context", counting)
    from llmtrain.api.validation import parse_job

    assert len(openapi_schema()["properties"]["spec"]["x-kubernetes-validations"]) > 10
    parse_job(minimal_job("j"))
    specs = [v for v in made if isinstance(v["self"], dict) and "model" in v["self"]]
    assert len(specs) == 1, f"the spec converted {len(specs)} times"


def test_the_rule_builders_make_the_entries_the_models_carry() -> None:
    """base.py's builders called directly: the models call them once, at import, so a builder
    that went wrong would reach the CRD unseen by the tests that read the schema."""
    assert cel("self > 0", "give more") == {"rule": "self > 0", "message": "give more"}
    assert cel("self > 0", "give more", ".n") == {
        "rule": "self > 0",
        "message": "give more",
        "fieldPath": ".n",
    }
    assert immutable("model") == {
        "x-kubernetes-validations": [
            {
                "rule": SELF_EQ,
                "message": "spec.model is immutable after creation: create a new LLMTrainingJob "
                "(or delete and re-apply this one) to change it",
            }
        ]
    }
    well_formed, positive = positive_quantity("resources.memory", "64Gi")["x-kubernetes-validations"]
    assert well_formed == {
        "rule": QUANTITY_RULE,
        "message": "resources.memory must be a Kubernetes quantity: use e.g. 64Gi (a number and an "
        "optional unit: Ki, Mi, Gi, Ti, k, M, G, T, or m for thousandths; no space; GB is not a unit)",
    }
    assert positive == {
        "rule": POSITIVE_QUANTITY_RULE,
        "message": "resources.memory must be greater than zero: give a positive quantity such as '64Gi'",
    }
    (only,) = metadata_keys_rule("labels")["x-kubernetes-validations"]
    keys, reserved = metadata_keys_rule("labels", ("ray.io/", "llmtrain.dev/"))["x-kubernetes-validations"]
    assert only == keys
    assert keys["message"] == (
        "labels keys must be valid Kubernetes keys ([prefix/]name, name at most 63 characters "
        "of letters, digits, '-', '_' and '.')"
    )
    assert reserved["message"] == (
        "labels keys under ray.io/, llmtrain.dev/ belong to the platform and KubeRay: use your own prefix"
    )
    assert evaluate_rule(keys["rule"], {"team": "a", "example.com/x": "b", "a" * 63: "c"})
    for bad in ("-team", "a" * 64, "Example.com/x", "example.com/", f"{'a' * 253}/{'b' * 63}"):
        assert not evaluate_rule(keys["rule"], {bad: "x"}), bad
    assert evaluate_rule(reserved["rule"], {"example.com/x": "b", "team": "a"})
    for bad in ("ray.io/node-type", "llmtrain.dev/job"):
        assert not evaluate_rule(reserved["rule"], {"team": "a", bad: "x"}), bad


_LIST_MAP: dict[str, Any] = {
    "type": "object",
    "properties": {
        "env": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                "x-kubernetes-validations": [
                    {
                        "rule": "self.value == oldSelf.value",
                        "message": "value is immutable",
                        "fieldPath": ".value",
                    }
                ],
            },
        },
        "plain": {
            "type": "array",
            "items": {"type": "string", "x-kubernetes-validations": [{"rule": SELF_EQ, "message": "fixed"}]},
        },
        "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self > 0.5", "message": "more"}]},
    },
}


def test_a_list_maps_items_meet_their_old_selves_by_key_as_the_api_server_does() -> None:
    """The engine's walk, on a schema of its own: an item of a list-map keeps its transition rules
    against the old item of the same key, wherever either list has it; a new key has no old self;
    items of a plain list have none (the API server's correlation rules); a number field's integer
    is a double to CEL."""
    old = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], "plain": ["x"], "ratio": 1}
    same = {"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}, {"name": "C", "value": "3"}]}
    assert violations(_LIST_MAP, same, old=old) == []
    changed = {"env": [{"name": "C", "value": "3"}, {"name": "A", "value": "9"}], "plain": ["y"], "ratio": 1}
    assert [(v.path, v.message) for v in violations(_LIST_MAP, changed, old=old)] == [
        (".env[1].value", "value is immutable")
    ]
    assert violations(_LIST_MAP, changed) == []  # a create: no old object, no transition rules
    assert [v.path for v in violations(_LIST_MAP, {"ratio": 0})] == [".ratio"]


def test_the_object_uri_rules_built_again_are_the_ones_the_crd_carries() -> None:
    """spec.py builds its object-URI rules once, at import, into the spec's rules that CASES
    checks one by one: built again they must be those rules, so that a builder gone wrong shows."""
    fresh = _object_uri_rules()
    carried = openapi_schema()["properties"]["spec"]["x-kubernetes-validations"]
    # A well-formed-URI rule for each field but checkpoint.exportTo (its pattern admits object URIs
    # only), and one rule per store (s3, gs, az) for each of the five fields.
    assert len(fresh) == 4 + 5 * 3
    assert fresh == carried[: len(fresh)]
    spec = {"dataset": {"path": "s3://corpus/a"}, "model": {}, "checkpoint": {}}
    refused = [entry for entry in fresh if not evaluate_rule(entry["rule"], spec)]
    assert [(e["fieldPath"], e["message"].split(":")[0]) for e in refused] == [
        (".dataset.path", "dataset.path is an s3")
    ]

"""The fake nodes kwok manages, the Stages that move their pods, and the storage they provision.

Two GPU nodes as a GPU cloud presents them (8 `nvidia.com/gpu`, the GPU product label, a
`NoSchedule` taint on the GPU resource, the RDMA and EFA devices of their fabric) and one CPU
node. Stages are kwok's own (from its Go module), less `pod-complete`: a Job's pods (KubeRay's
submitter) stay Running until a test says how they end (`pod_outcome_stage`). The volume
provisioning stage is widened from kwok's one StorageClass to ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

FAKE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_NODES = ("gpu-node-0", "gpu-node-1")
CPU_NODES = ("cpu-node-0",)
GPUS_PER_NODE = 8
# The fabric devices a GPU node's device plugins advertise: the NVIDIA network operator's RDMA
# shared device pool (its rdmaHcaMax) and the 32 EFA interfaces of a p5.48xlarge.
FABRIC_DEVICES = {"rdma/rdma_shared_device_a": "1000", "vpc.amazonaws.com/efa": "32"}
VOLUME_PROVISIONER = "kwok.x-k8s.io/volume"
# Beside a real node, the fake CPU node carries this PreferNoSchedule taint: a pod that fits the
# real node (the README's tiny-cpu example, with no node selector) runs there for real, while a
# pod too big for it (a large job's head) still lands on the fake node.
FAKE_NODE_TAINT = {"key": "llmtrain.dev/fake-node", "value": "true", "effect": "PreferNoSchedule"}

_STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
    "volume/fast/pvc-provision.yaml",
    "volume/fast/pv-bind.yaml",
    "volume/fast/pv-delete.yaml",
    "volume/fast/pvc-delete.yaml",
)


def _node(name: str, *, cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "1Ti"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {FAKE_ANNOTATION: "fake"}},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        capacity.update(FABRIC_DEVICES)
        node["status"]["allocatable"] = dict(capacity)
        labels[GPU_PRODUCT_LABEL] = GPU_PRODUCT
        labels["nvidia.com/gpu.present"] = "true"
        node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    return node


def fake_nodes(beside_real_node: bool = False) -> list[dict[str, Any]]:
    gpu = [_node(n, cpu="192", memory="2Ti", gpus=GPUS_PER_NODE) for n in GPU_NODES]
    cpu = [_node(n, cpu="32", memory="128Gi", gpus=0) for n in CPU_NODES]
    if beside_real_node:
        for node in cpu:
            node["spec"]["taints"] = [FAKE_NODE_TAINT]
    return [*gpu, *cpu]


def stages(kwok_module: Path, storage_classes: Iterable[str]) -> list[dict[str, Any]]:
    classes = ", ".join(f"'{c}'" for c in storage_classes)
    out: list[dict[str, Any]] = []
    for rel in _STAGE_FILES:
        for doc in yaml.safe_load_all((kwok_module / "kustomize" / "stage" / rel).read_text()):
            if doc["metadata"]["name"] == "pvc-provision":
                for expr in doc["spec"]["selector"]["matchExpressions"]:
                    cel = expr.get("cel", {})
                    if "storageClassName ==" in cel.get("expression", ""):
                        cel["expression"] = f"self.spec.storageClassName in [{classes}]"
            out.append(doc)
    return out


def storage_classes(names: Iterable[str], *, default: bool = True) -> list[dict[str, Any]]:
    """kwok's StorageClasses; the first is the cluster's default unless `default` is False."""
    out = []
    for i, name in enumerate(names):
        sc: dict[str, Any] = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": VOLUME_PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        if i == 0 and default:
            sc["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
        out.append(sc)
    return out


def pod_outcome_stage(kwok_module: Path, name: str, namespace: str, *, succeed: bool) -> dict[str, Any]:
    """A Stage ending the Running Job-owned pods of one namespace: Succeeded (exit 0) or Failed (1)."""
    text = (kwok_module / "kustomize" / "stage" / "pod" / "fast" / "pod-complete.yaml").read_text()
    if not succeed:
        text = text.replace("exitCode: 0", "exitCode: 1").replace("reason: Completed", "reason: Error")
        text = text.replace("phase: Succeeded", "phase: Failed")
    stage: dict[str, Any] = yaml.safe_load(text)
    stage["metadata"] = {"name": name}
    stage["spec"]["selector"]["matchExpressions"].append(
        {"key": ".metadata.namespace", "operator": "In", "values": [namespace]}
    )
    stage["spec"]["weight"] = 1
    return stage

"""What a worker pod of the infiniband and efa profiles needs beyond NCCL variables.

NCCL reaches an RDMA fabric only through its devices (handed out by a device plugin as an extended
resource) and with the right to pin registered memory (IPC_LOCK, or an unlimited memlock limit
from the container runtime); without them it falls back to TCP sockets. Only the workers run NCCL,
so only they get either; every other pod, and every pod of the other profiles, stays restricted.
"""

from __future__ import annotations

from typing import Any

from llmtrain.api.spec import FABRIC_PROFILES, FabricSpec, LLMTrainingJobSpec

# The device each profile requests when spec.network.fabric.resourceName is unset.
DEFAULT_DEVICE_RESOURCES = {
    # The NVIDIA network operator's RDMA shared device plugin, as its examples name the pool.
    "infiniband": "rdma/rdma_shared_device_a",
    # The AWS EFA Kubernetes device plugin.
    "efa": "vpc.amazonaws.com/efa",
}
# The one capability a fabric worker adds: pinning memory that the NIC registers.
FABRIC_CAPABILITY = "IPC_LOCK"
# Where NCCL writes its debug log (one file per process: %h host, %p pid) for the start-up check.
NCCL_DEBUG_FILE = "/tmp/llmtrain-nccl.%h.%p.log"


def fabric_settings(spec: LLMTrainingJobSpec) -> FabricSpec | None:
    """The job's fabric settings (defaults filled in), or None when its workers use no fabric."""
    if spec.network.nccl_profile not in FABRIC_PROFILES or spec.resources.gpus_per_worker == 0:
        return None
    return spec.network.fabric or FabricSpec()


def fabric_devices(spec: LLMTrainingJobSpec) -> dict[str, str]:
    """The worker container's extra resources (requests = limits): the fabric device, or none."""
    fabric = fabric_settings(spec)
    if fabric is None:
        return {}
    name = fabric.resource_name or DEFAULT_DEVICE_RESOURCES[spec.network.nccl_profile]
    return {name: str(fabric.per_worker)}


def worker_capabilities(spec: LLMTrainingJobSpec, restricted: dict[str, Any]) -> dict[str, Any]:
    """The worker container's capabilities: the restricted ones, plus IPC_LOCK on a fabric."""
    fabric = fabric_settings(spec)
    if fabric is None or not fabric.ipc_lock:
        return restricted
    return {**restricted, "add": [FABRIC_CAPABILITY]}

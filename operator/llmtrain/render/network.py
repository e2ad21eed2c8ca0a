"""NCCL environment per fabric profile; user overrides win. CPU jobs get none of it."""

from __future__ import annotations

from typing import Any

from llmtrain.api.spec import FABRIC_PROFILES, NetworkSpec
from llmtrain.render.fabric import NCCL_DEBUG_FILE

# Interfaces NCCL must never bootstrap over inside a pod.
_NOT_LOOPBACK = "^lo,docker0"

PROFILES: dict[str, dict[str, str]] = {
    # Let NCCL detect the fabric; only keep it off the loopback interface.
    "auto": {"NCCL_SOCKET_IFNAME": _NOT_LOOPBACK},
    # One node with NVLink/NVSwitch: peer-to-peer over NVLink, no network transport needed.
    "nvlink": {"NCCL_SOCKET_IFNAME": _NOT_LOOPBACK, "NCCL_P2P_LEVEL": "NVL"},
    "infiniband": {
        "NCCL_SOCKET_IFNAME": _NOT_LOOPBACK,
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_TIMEOUT": "22",
        "NCCL_IB_RETRY_CNT": "7",
    },
    # AWS EFA through the aws-ofi-nccl plugin (libfabric), which the image installs as
    # libnccl-net-ofi.so: NCCL loads it only when asked to.
    "efa": {
        "NCCL_SOCKET_IFNAME": _NOT_LOOPBACK,
        "NCCL_NET_PLUGIN": "ofi",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
    },
    # Plain TCP: more sockets and threads per connection to fill the link.
    "ethernet": {
        "NCCL_SOCKET_IFNAME": _NOT_LOOPBACK,
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "4",
    },
}


# NCCL_DEBUG levels, least verbose first.
_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def _fabric_check_env(network: NetworkSpec) -> dict[str, str]:
    """The trainer's start-up check reads which transport NCCL chose from NCCL's INFO lines of
    the INIT and NET subsystems; NCCL writes them to one file per process, not to the job's log.
    A level of INFO or above that the user chose is kept, with NCCL's own subsystem selection."""
    if _DEBUG_LEVELS.index(network.nccl_debug) >= _DEBUG_LEVELS.index("INFO"):
        return {"NCCL_DEBUG": network.nccl_debug, "NCCL_DEBUG_FILE": NCCL_DEBUG_FILE}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": NCCL_DEBUG_FILE}


def nccl_env(network: NetworkSpec, uses_gpu: bool) -> dict[str, str]:
    if not uses_gpu:
        return {}
    env = dict(PROFILES[network.nccl_profile])
    env["NCCL_DEBUG"] = network.nccl_debug
    if network.nccl_profile in FABRIC_PROFILES:
        env.update(_fabric_check_env(network))
    # Fail fast on a broken collective instead of hanging until the job deadline.
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(network.collective_timeout_seconds)
    return env


def container_env(network: NetworkSpec, uses_gpu: bool) -> list[dict[str, Any]]:
    """Profile variables, then the user's overrides (which win, also on CPU jobs); a user's
    variable from a Secret becomes a `valueFrom.secretKeyRef` entry, never a value."""
    env: dict[str, dict[str, Any]] = {
        name: {"name": name, "value": value} for name, value in nccl_env(network, uses_gpu).items()
    }
    for var in network.env:
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            env[var.name] = {
                "name": var.name,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        else:
            env[var.name] = {"name": var.name, "value": var.value or ""}
    return list(env.values())

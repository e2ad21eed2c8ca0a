"""Did NCCL reach the fabric the job asked for? Decided at start-up from NCCL's own log.

Without the RDMA devices, the user-space libraries or the right to pin memory, NCCL does not fail:
it quietly carries every collective over TCP sockets, ten to a hundred times slower. For the
infiniband and efa profiles the renderer has NCCL write its INIT and NET lines to one file per
process (NCCL_DEBUG_FILE); after the first collective has created the communicator, each worker
reads which transport NCCL chose ("Using network ...") and fails or warns, as
spec.network.fabric.onSocketFallback says, when it is not the fabric.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmtrain.api.spec import FABRIC_PROFILES, FabricSpec, NetworkSpec

log = logging.getLogger("llmtrain_trainer")

Transport = Literal["IB", "OFI", "Socket"]
Action = Literal["fail", "warn", "none"]

# The transport each fabric profile needs NCCL to choose.
EXPECTED: dict[str, Transport] = {"infiniband": "IB", "efa": "OFI"}
# NCCL's line naming the network it chose for a communicator (init.cc, INFO of subsystem INIT).
_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_CAP_IPC_LOCK = 14


class FabricError(RuntimeError):
    """NCCL fell back to TCP sockets on a job that asked for a fabric."""


@dataclass(frozen=True)
class Verdict:
    transport: str | None
    action: Action
    message: str


def should_check(profile: str, on_gpu: bool) -> bool:
    """Only GPU workers of a fabric profile run NCCL over a fabric; CPU jobs use gloo."""
    return on_gpu and profile in FABRIC_PROFILES


def transport_of(network_name: str) -> str:
    """NCCL's network name as one of IB, OFI or Socket (another plugin's name as is)."""
    if network_name == "Socket":
        return "Socket"
    if network_name.startswith("IB"):  # IB, and IBext of the SHARP plugin
        return "IB"
    if "Libfabric" in network_name or "OFI" in network_name:  # aws-ofi-nccl: "[AWS ]Libfabric"
        return "OFI"
    return network_name


def nccl_transport(lines: Iterable[str]) -> str | None:
    """The transport of NCCL's last "Using network" line (one per communicator), or None."""
    chosen = None
    for line in lines:
        match = _USING_NETWORK.search(line)
        if match:
            chosen = transport_of(match["name"])
    return chosen


def _hints(lines: list[str]) -> str:
    """NCCL's own reasons (its WARN lines and the IB/plugin probes), for the message."""
    keep = [
        line.split("NCCL ", 1)[-1].strip()
        for line in lines
        if "NCCL WARN" in line or "No device found" in line or "NET/Plugin" in line
    ]
    return "; ".join(keep[:4])


def decide(profile: str, lines: list[str], fabric: FabricSpec | None, log_file: str) -> Verdict:
    """What to do about the transport NCCL chose, from its log lines (pure)."""
    expected = EXPECTED[profile]
    transport = nccl_transport(lines)
    if transport == expected:
        return Verdict(transport, "none", f"NCCL uses {transport} (network.ncclProfile {profile})")
    hints = _hints(lines)
    reason = f" NCCL said: {hints}." if hints else ""
    if transport is None:
        return Verdict(
            None,
            "warn",
            f"could not tell which transport NCCL chose: no 'Using network' line in {log_file} "
            "(NCCL_DEBUG below INFO or NCCL_DEBUG_FILE changed in network.env?)",
        )
    if transport != "Socket":
        other = f"NCCL uses {transport}, not {expected} (network.ncclProfile {profile}).{reason}"
        return Verdict(transport, "warn", other)
    on_fallback = (fabric or FabricSpec()).on_socket_fallback
    message = (
        f"NCCL fell back to TCP sockets instead of {expected} (network.ncclProfile {profile}): "
        f"collectives will be many times slower.{reason} Check that the worker got its fabric "
        "device (network.fabric.resourceName), that memory can be locked (IPC_LOCK or an "
        f"unlimited memlock limit) and NCCL's log in {log_file}; "
        "network.fabric.onSocketFallback: warn trains over TCP anyway."
    )
    return Verdict("Socket", "fail" if on_fallback == "fail" else "warn", message)


def debug_file(pattern: str, hostname: str, pid: int) -> Path:
    """NCCL_DEBUG_FILE as NCCL expands it: %h the host name (to its first dot), %p the pid."""
    return Path(pattern.replace("%h", hostname.split(".")[0]).replace("%p", str(pid)))


def memlock_warning(soft_limit: int, cap_eff: int) -> str | None:
    """RDMA registers (pins) the buffers NCCL sends from: that needs IPC_LOCK in effect or an
    unlimited memlock limit. A non-root process keeps an added capability only where the runtime
    makes it ambient, so the limit is what usually decides."""
    if soft_limit == resource.RLIM_INFINITY or cap_eff & (1 << _CAP_IPC_LOCK):
        return None
    return (
        f"the memlock limit is {soft_limit} bytes and IPC_LOCK is not in effect: RDMA memory "
        "registration may fail; give the container runtime an unlimited memlock limit "
        "(e.g. LimitMEMLOCK=infinity for containerd)"
    )


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_fabric(network: NetworkSpec, warm_up: Callable[[], None]) -> Verdict:
    """Run once per worker on GPUs of a fabric profile: `warm_up` makes NCCL create its
    communicator (a collective every rank reaches); then read this process's NCCL log and act."""
    memlock = memlock_warning(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], _cap_eff())
    if memlock:
        log.warning("fabric: %s", memlock)
    warm_up()
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    path = debug_file(pattern, socket.gethostname(), os.getpid()) if pattern else None
    lines = path.read_text(errors="replace").splitlines() if path and path.is_file() else []
    verdict = decide(network.nccl_profile, lines, network.fabric, str(path or "NCCL_DEBUG_FILE (unset)"))
    if verdict.action == "fail":
        raise FabricError(verdict.message)
    if verdict.action == "warn":
        log.warning("fabric: %s", verdict.message)
    else:
        log.info("fabric: %s", verdict.message)
    return verdict

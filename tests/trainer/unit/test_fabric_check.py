"""The start-up fabric check: which transport NCCL chose, read from its own INFO lines, and what the
trainer does about it per profile and spec.network.fabric.onSocketFallback (pure, on CPU)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from llmtrain.api.spec import FabricSpec, NetworkSpec
from llmtrain_trainer import fabric_check
from llmtrain_trainer.fabric_check import (
    FabricError,
    debug_file,
    decide,
    memlock_warning,
    nccl_transport,
    should_check,
)

# NCCL 2.2x lines as NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET writes them.
IB_LOG = [
    "worker-0:412:412 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ^lo,docker0",
    "worker-0:412:412 [0] NCCL INFO Bootstrap : Using eth0:10.244.1.5<0>",
    "worker-0:412:412 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.",
    "worker-0:412:412 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
    "[3]mlx5_3:1/IB [RO]; OOB eth0:10.244.1.5<0>",
    "worker-0:412:412 [0] NCCL INFO Using network IB",
    "worker-0:412:412 [0] NCCL INFO ncclCommInitRank comm 0x55d1c0 rank 0 nranks 32 cudaDev 0 "
    "nvmlDev 0 busId 18000 commId 0x5f1e - Init START",
]
OFI_LOG = [
    "worker-1:77:77 [3] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)",
    "worker-1:77:77 [3] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.17.3",
    "worker-1:77:77 [3] NCCL INFO NET/OFI Using Libfabric version 1.17",
    "worker-1:77:77 [3] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)",
    "worker-1:77:77 [3] NCCL INFO Using network Libfabric",
]
SOCKET_LOG = [
    "worker-0:412:412 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.",
    "worker-0:412:412 [0] NCCL INFO NET/IB : No device found.",
    "worker-0:412:412 [0] NCCL INFO NET/Socket : Using [0]eth0:10.244.1.5<0>",
    "worker-0:412:412 [0] NCCL INFO Using network Socket",
]


@pytest.mark.parametrize(
    ("lines", "transport"),
    [
        (IB_LOG, "IB"),
        (OFI_LOG, "OFI"),
        (SOCKET_LOG, "Socket"),
        (["h:1:1 [0] NCCL INFO Using network AWS Libfabric"], "OFI"),  # older aws-ofi-nccl
        (["h:1:1 [0] NCCL INFO Using network IBext_v8"], "IB"),  # the SHARP plugin
        (["h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE"], None),  # no decision line yet
        ([], None),
        # Several communicators: the last one's network counts.
        ([*IB_LOG, *SOCKET_LOG], "Socket"),
    ],
)
def test_transport_from_nccls_lines(lines: list[str], transport: str | None) -> None:
    assert nccl_transport(lines) == transport


def test_the_expected_fabric_needs_nothing() -> None:
    assert decide("infiniband", IB_LOG, None, "/tmp/x").action == "none"
    assert decide("efa", OFI_LOG, None, "/tmp/x").action == "none"


@pytest.mark.parametrize("profile", ["infiniband", "efa"])
def test_sockets_fail_by_default_and_warn_when_asked(profile: str) -> None:
    failed = decide(profile, SOCKET_LOG, None, "/tmp/llmtrain-nccl.worker-0.412.log")
    assert failed.action == "fail" and failed.transport == "Socket"
    assert "fell back to TCP sockets" in failed.message
    assert "NET/IB : No device found." in failed.message  # NCCL's own reason
    assert "/tmp/llmtrain-nccl.worker-0.412.log" in failed.message
    assert "onSocketFallback: warn" in failed.message
    warned = decide(profile, SOCKET_LOG, FabricSpec(on_socket_fallback="warn"), "/tmp/x")
    assert warned.action == "warn" and warned.message == decide(profile, SOCKET_LOG, None, "/tmp/x").message


def test_another_network_or_no_line_warns_and_never_fails() -> None:
    wrong = decide("efa", IB_LOG, FabricSpec(on_socket_fallback="fail"), "/tmp/x")
    assert wrong.action == "warn" and "NCCL uses IB, not OFI" in wrong.message
    unknown = decide("infiniband", [], None, "/tmp/x")
    assert unknown.action == "warn" and unknown.transport is None
    assert "could not tell" in unknown.message


def test_checked_only_on_gpus_with_a_fabric_profile() -> None:
    assert should_check("infiniband", on_gpu=True) and should_check("efa", on_gpu=True)
    for profile in ("auto", "nvlink", "ethernet"):
        assert not should_check(profile, on_gpu=True)
    for profile in ("infiniband", "efa", "auto"):
        assert not should_check(profile, on_gpu=False)  # CPU workers use gloo


def test_the_debug_file_is_expanded_as_nccl_does() -> None:
    pattern = "/tmp/llmtrain-nccl.%h.%p.log"
    assert debug_file(pattern, "worker-0.pod.local", 412) == Path("/tmp/llmtrain-nccl.worker-0.412.log")


def test_memlock_needs_an_unlimited_limit_or_ipc_lock_in_effect() -> None:
    assert memlock_warning(resource.RLIM_INFINITY, 0) is None
    assert memlock_warning(8 * 1024 * 1024, 1 << 14) is None  # CAP_IPC_LOCK effective
    warning = memlock_warning(8 * 1024 * 1024, 0)
    assert warning is not None and "LimitMEMLOCK=infinity" in warning


def test_check_reads_this_processes_log_after_the_first_collective(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring: the collective runs first (NCCL writes its file then), the file is found from
    NCCL_DEBUG_FILE, and a socket fallback raises unless the spec says warn."""
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    monkeypatch.setattr(fabric_check.socket, "gethostname", lambda: "worker-0")
    monkeypatch.setattr(fabric_check.os, "getpid", lambda: 412)
    log = tmp_path / "nccl.worker-0.412.log"

    def collective() -> None:
        log.write_text("\n".join(SOCKET_LOG) + "\n")

    network = NetworkSpec(nccl_profile="infiniband")
    with pytest.raises(FabricError, match="fell back to TCP sockets"):
        fabric_check.check_fabric(network, collective)
    warn = NetworkSpec(nccl_profile="infiniband", fabric=FabricSpec(on_socket_fallback="warn"))
    assert fabric_check.check_fabric(warn, collective).action == "warn"
    log.write_text("\n".join(IB_LOG))
    assert fabric_check.check_fabric(network, lambda: None).transport == "IB"

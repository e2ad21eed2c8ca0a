"""The trainer image carries what NCCL needs to reach InfiniBand and EFA (static: no Docker here).

The CUDA runtime base ships no RDMA user space, so NCCL would fall back to TCP sockets: the image
installs rdma-core's verbs library and providers, libfabric, and builds the aws-ofi-nccl plugin at
a pinned, checksummed version, under the name the efa profile's NCCL_NET_PLUGIN makes NCCL load.
"""

from __future__ import annotations

import re

from llmtrain.render.network import PROFILES

from tests.support.jobs import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "trainer_image" / "Dockerfile").read_text()


def _stage(name: str) -> str:
    """The text of one build stage (`FROM ... AS name`, or the unnamed last one for "runtime")."""
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)[1:]
    for stage in stages:
        header = stage.splitlines()[0]
        if header.endswith(f" AS {name}") or (name == "runtime" and " AS " not in header):
            return stage
    raise AssertionError(f"no stage {name}")


def _installed(stage: str) -> set[str]:
    packages: set[str] = set()
    for command in re.findall(r"apt-get install -y --no-install-recommends ((?:[^&]|\\\n)+)", stage):
        packages |= {p for p in command.replace("\\\n", " ").split() if not p.startswith("-")}
    return packages


def test_the_runtime_has_the_rdma_user_space_and_libfabric() -> None:
    runtime = _installed(_stage("runtime"))
    # libibverbs with the mlx5 (InfiniBand/RoCE) and efa providers, and ibv_devinfo.
    assert {"ibverbs-providers", "ibverbs-utils"} <= runtime
    # libfabric (its efa provider) with fi_info; hwloc, which aws-ofi-nccl links.
    assert {"libfabric-bin", "hwloc-nox"} <= runtime


def test_aws_ofi_nccl_is_built_pinned_and_checksummed() -> None:
    fabric = _stage("fabric")
    version = re.search(r"^ARG AWS_OFI_NCCL_VERSION=(\d+\.\d+\.\d+)$", fabric, re.MULTILINE)
    checksum = re.search(r"^ARG AWS_OFI_NCCL_SHA256=([0-9a-f]{64})$", fabric, re.MULTILINE)
    assert version and checksum
    assert "sha256sum -c -" in fabric
    assert {"libfabric-dev", "libhwloc-dev", "libibverbs-dev"} <= _installed(fabric)
    assert "--with-cuda=/usr/local/cuda" in fabric
    # The distribution's libfabric and hwloc are on the default paths; naming /usr adds
    # `-isystem /usr/include`, which breaks the C++ build (`#include_next <stdlib.h>` fails).
    assert not re.search(r"--with-(libfabric|hwloc)=/usr\b", fabric)


def test_nccl_finds_the_plugin_only_when_the_efa_profile_asks() -> None:
    """Installed as libnccl-net-ofi.so on the library path, without the default libnccl-net.so
    name: NCCL loads it for NCCL_NET_PLUGIN=ofi (the efa profile) and keeps its own IB transport
    for infiniband."""
    assert "rm -f /opt/aws-ofi-nccl/lib/libnccl-net.so" in _stage("fabric")
    assert "test -f /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so" in _stage("fabric")
    runtime = _stage("runtime")
    assert "COPY --from=fabric /opt/aws-ofi-nccl /opt/aws-ofi-nccl" in runtime
    assert re.search(r"LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:\$\{LD_LIBRARY_PATH\}", runtime)
    assert PROFILES["efa"]["NCCL_NET_PLUGIN"] == "ofi"
    assert "NCCL_NET_PLUGIN" not in PROFILES["infiniband"]
    assert PROFILES["efa"]["FI_PROVIDER"] == "efa"  # libfabric may not pick its tcp provider

"""How many CPUs this process may really use: its affinity mask and its cgroup CPU quota.

`os.cpu_count()` reports the node's cores, so a pod limited to 4 CPUs on a 64-core node would fork
64 tokenizer processes that the kernel then throttles to 4 CPUs' worth of time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> int | None:
    """CPUs allowed by the cgroup quota (rounded up), or None when there is no quota.

    cgroup v2 keeps `<quota> <period>` (or `max <period>`) in cpu.max; v1 keeps
    cpu.cfs_quota_us (-1 for none) and cpu.cfs_period_us under cpu/ or cpu,cpuacct/.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            return max(1, math.ceil(int(parts[0]) / int(parts[1])))
        return None
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota, period = _read(root / folder / "cpu.cfs_quota_us"), _read(root / folder / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            if int(quota) <= 0 or int(period) <= 0:
                return None
            return max(1, math.ceil(int(quota) / int(period)))
    return None


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """The smaller of the CPUs this process may be scheduled on and its cgroup quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    return max(1, min(affinity, limit) if limit is not None else affinity)

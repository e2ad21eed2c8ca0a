"""Deterministic child names, at most 47 characters and DNS-1035 (KubeRay's RayJob limit).

Determinism is what makes the operator idempotent (create-or-adopt by name) and resume work.
"""

from __future__ import annotations

import hashlib

MAX_CHILD_NAME = 47


def child_name(job_name: str, suffix: str = "") -> str:
    full = f"{job_name}-{suffix}" if suffix else job_name
    if len(full) <= MAX_CHILD_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:5]
    tail = f"-{digest}-{suffix}" if suffix else f"-{digest}"
    return job_name[: MAX_CHILD_NAME - len(tail)].rstrip("-") + tail


def rayjob_name(job_name: str) -> str:
    return child_name(job_name)


def configmap_name(job_name: str) -> str:
    return child_name(job_name, "config")


def pvc_name(job_name: str) -> str:
    return child_name(job_name, "storage")


def trainer_account_name(job_name: str) -> str:
    """ServiceAccount, Role and RoleBinding share this name."""
    return child_name(job_name, "trainer")

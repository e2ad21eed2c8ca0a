"""Deterministic child names, DNS-1035 and at most `MAX_NAME_LENGTH` (47) characters, KubeRay's limit.

Determinism is what makes the operator idempotent (create-or-adopt by name) and resume work.
"""

from __future__ import annotations

import hashlib

from llmtrain.constants import MAX_NAME_LENGTH


def child_name(job_name: str, suffix: str = "") -> str:
    full = f"{job_name}-{suffix}" if suffix else job_name
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:5]
    tail = f"-{digest}-{suffix}" if suffix else f"-{digest}"
    return job_name[: MAX_NAME_LENGTH - len(tail)].rstrip("-") + tail


def rayjob_name(job_name: str) -> str:
    return child_name(job_name)


def configmap_name(job_name: str) -> str:
    return child_name(job_name, "config")


def pvc_name(job_name: str) -> str:
    return child_name(job_name, "storage")


def trainer_account_name(job_name: str) -> str:
    """The job's ServiceAccount (earlier operators named its Role and RoleBinding so too). The
    chart's admission policies check this rule in CEL: keep them in step."""
    return child_name(job_name, "trainer")

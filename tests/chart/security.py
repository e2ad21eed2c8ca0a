"""The restricted Pod Security profile, plus this project's bar (resources, no host ports), as a check."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# Volume types the restricted Pod Security profile allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: Obj) -> list[str]:
    """Why a pod spec breaks the restricted profile or this project's bar (empty when it does not)."""
    problems: list[str] = []
    pod_sc = pod.get("securityContext", {})
    if pod_sc.get("runAsNonRoot") is not True:
        problems.append("pod securityContext.runAsNonRoot is not true")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runs as uid 0")
    if pod_sc.get("seccompProfile", {}).get("type") not in {"RuntimeDefault", "Localhost"}:
        problems.append("pod seccompProfile is not RuntimeDefault/Localhost")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"pod sets {field}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    for container in pod.get("initContainers", []) + pod["containers"]:
        name = container["name"]
        sc = container.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if caps.get("add"):
            problems.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem is not true")
        if sc.get("runAsNonRoot") is not True:
            problems.append(f"{name}: container securityContext.runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{name}: runs as uid 0")
        if sc.get("seccompProfile", {}).get("type") not in {"RuntimeDefault", "Localhost"}:
            problems.append(f"{name}: container seccompProfile is not RuntimeDefault/Localhost")
        for port in container.get("ports", []):
            if "hostPort" in port:
                problems.append(f"{name}: hostPort {port['hostPort']}")
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(kind, {}):
                    problems.append(f"{name}: no {resource} {kind[:-1]}")
    return problems

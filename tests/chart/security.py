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
# SELinux types the baseline (and so restricted) profile allows; no custom user or role.
CONFINED_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}


def _profile_problems(where: str, sc: Obj) -> list[str]:
    """seccomp, AppArmor and SELinux settings of one pod or container securityContext."""
    problems: list[str] = []
    for field in ("seccompProfile", "appArmorProfile"):
        profile = sc.get(field)
        if profile is None:
            continue
        if profile.get("type") not in {"RuntimeDefault", "Localhost"}:
            problems.append(f"{where} {field} is {profile.get('type')}")
        if (profile.get("type") == "Localhost") != bool(profile.get("localhostProfile")):
            problems.append(f"{where} {field}: localhostProfile goes with type Localhost only")
    selinux = sc.get("seLinuxOptions", {})
    if selinux.get("type", "") not in CONFINED_SELINUX_TYPES:
        problems.append(f"{where} SELinux type {selinux['type']}")
    for field in ("user", "role"):
        if selinux.get(field):
            problems.append(f"{where} sets SELinux {field}")
    return problems


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
    problems += _profile_problems("pod", pod_sc)
    if pod_sc.get("sysctls"):
        problems.append("pod sets sysctls")
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
        problems += _profile_problems(f"{name}:", sc)
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount {sc['procMount']}")
        for port in container.get("ports", []):
            if "hostPort" in port:
                problems.append(f"{name}: hostPort {port['hostPort']}")
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(kind, {}):
                    problems.append(f"{name}: no {resource} {kind[:-1]}")
    return problems

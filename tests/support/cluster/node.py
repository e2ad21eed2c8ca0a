"""One real node beside kwok's fake ones: containerd + runc, kubelet, kube-proxy, CoreDNS, and
rancher's local-path-provisioner, all local processes of the cluster supervisor.

Everything the node runs lives in the network namespace `netns.create` makes (see netns.py for
how the API server and the node reach each other) and under `<cluster>/node/`: containerd's state
(pod network namespaces, runc's state), the CNI configuration, kubelet's root and pod logs, the
volumes. Its cgroups hang under `/<namespace name>` in every hierarchy, so two clusters on one
machine never share one.

Images come from OCI archives (`load_image`); no registry is reachable. containerd's root, where
they are kept unpacked, is a store shared between sessions when no other node uses it
(`_take_image_store`), so a multi-GB image is imported once. The sandbox image is the
pause binary images.py builds. Pods reach the API server through the `kubernetes` Service, and
cluster DNS is CoreDNS at 10.96.0.10 (a host process in the namespace, answering only for
`cluster.local`: there is no upstream to forward to). Volumes: the `local-path` StorageClass
(the default here) provisions hostPath volumes under `<cluster>/node/volumes` with local-path's
shared-filesystem mode, which is what lets it bind ReadWriteMany claims on this single node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import images, netns, pki, processes

NODE_NAME = "real-node-0"
REAL_NODE_LABEL = "llmtrain.dev/real-node"
POD_CIDR = "10.245.0.0/24"
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
STORAGE_CLASS = "local-path"
PROVISIONER = "rancher.io/local-path"
PROVISIONER_NAMESPACE = "local-path-storage"
# Stopped in this order by Cluster.down, before the control plane; the network goes last.
STOP_ORDER = ["local-path-provisioner", "coredns", "kube-proxy", "kubelet", "containerd", "api-relay"]
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class NodeInfo:
    """What `down` and `load_image` need, kept in `<cluster>/node/node.json`."""

    netns: str
    host_ip: str
    node_ip: str
    containerd_address: str
    ctr: str
    cgroup: str
    image_store: str = ""  # containerd's root: the shared store (images.store_dir) or the node's

    @classmethod
    def load(cls, directory: Path) -> NodeInfo | None:
        path = directory / "node" / "node.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def apiserver_hosts(net: netns.NodeNetwork | None) -> tuple[str, ...]:
    """Extra names the API server's certificate must carry for the node's side of the relay."""
    return (net.node_ip,) if net else ()


def start(
    d: Path,
    net: netns.NodeNetwork,
    *,
    api_port: int,
    bins: dict[str, str],
    ca: pki.CertificateAuthority,
    apply: Callable[[list[dict[str, Any]]], None],
) -> NodeInfo:
    """Start the node's processes in `net`; returns once they are started (`wait_ready` waits)."""
    node = d / "node"
    node.mkdir()
    cgroup = f"/{net.name}"
    store, store_lock = _take_image_store(node)
    info = NodeInfo(
        netns=net.name,
        host_ip=net.host_ip,
        node_ip=net.node_ip,
        containerd_address=str(node / "containerd.sock"),
        ctr=bins["ctr"],
        cgroup=cgroup,
        image_store=str(store),
    )
    (node / "node.json").write_text(json.dumps(info.__dict__, indent=2))
    server = f"https://{net.node_ip}:{api_port}"
    path_env = {
        "PATH": ":".join(
            [
                str(Path(bins["containerd"]).parent),
                str(Path(bins["runc"]).parent),
                os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            ]
        )
    }

    processes.start(
        d,
        "api-relay",
        [
            sys.executable,
            "-m",
            "tests.support.cluster.netns",
            f"--netns={net.path}",
            f"--listen={net.node_ip}",
            f"--port={api_port}",
        ],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )

    def kubeconfig(name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        from tests.support.cluster.cluster import write_kubeconfig

        pair = ca.issue(name, common_name=user, groups=groups)
        return write_kubeconfig(
            node / f"{name}.kubeconfig",
            server,
            ca.cert,
            cert=pair.cert.read_bytes(),
            key=pair.key.read_bytes(),
        )

    # ---- containerd ----------------------------------------------------------------------------
    _make_cgroups(cgroup)
    cni_conf, cni_bin = node / "cni" / "net.d", Path(bins["bridge"]).parent
    cni_conf.mkdir(parents=True)
    (cni_conf / "10-llmtrain.conflist").write_text(json.dumps(_cni_config(node), indent=2))
    (node / "containerd.toml").write_text(_containerd_config(node, info, bins, cni_bin, cni_conf))
    try:
        processes.start(
            d,
            "containerd",
            net.enter([bins["containerd"], f"--config={node / 'containerd.toml'}", "--log-level=warn"]),
            env=path_env,
            # containerd (and the shims it starts) hold the shared store's lock until they exit.
            pass_fds=(store_lock,) if store_lock is not None else (),
        )
    finally:
        if store_lock is not None:
            os.close(store_lock)
    _wait_socket(d, Path(info.containerd_address), "containerd")
    for archive in (images.pause_archive(), images.busybox_archive()):
        load_image(info, archive)

    # ---- kubelet -------------------------------------------------------------------------------
    serving = ca.issue("kubelet-serving", common_name=NODE_NAME, hosts=(net.node_ip, NODE_NAME))
    kubelet_kc = kubeconfig("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
    (node / "resolv.conf").write_text("# no upstream DNS: nothing leaves the cluster's namespace\n")
    kubelet_config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup,
        "containerRuntimeEndpoint": f"unix://{info.containerd_address}",
        "address": net.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca.cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node / "resolv.conf"),
        "podLogsDir": str(node / "pod-logs"),
        "podCIDR": POD_CIDR,
        "failSwapOn": False,
        # Never evict or garbage-collect on this shared machine: loaded images cannot be pulled again.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 110,
    }
    (node / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config))
    processes.start(
        d,
        "kubelet",
        net.enter(
            [
                bins["kubelet"],
                f"--config={node / 'kubelet.yaml'}",
                f"--kubeconfig={kubelet_kc}",
                f"--root-dir={node / 'kubelet'}",
                f"--cert-dir={node / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={net.node_ip}",
                f"--node-labels={REAL_NODE_LABEL}=true",
                "--v=1",
            ]
        ),
        env=path_env,
    )

    # ---- kube-proxy ----------------------------------------------------------------------------
    proxy_kc = kubeconfig("kube-proxy", "system:kube-proxy")
    proxy_config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(proxy_kc)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": net.node_ip,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Pod -> Service -> pod on the same bridge: masquerade, so the reply comes back the same way.
        "iptables": {"masqueradeAll": True},
        # Leave the (host-wide) conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": ["primary"],
    }
    (node / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy_config))
    processes.start(
        d, "kube-proxy", net.enter([bins["kube-proxy"], f"--config={node / 'kube-proxy.yaml'}"]), env=path_env
    )

    # ---- CoreDNS: a host process in the namespace, behind the kube-dns Service -----------------
    dns_kc = kubeconfig("coredns", "llmtrain:coredns", ("system:masters",))
    (node / "Corefile").write_text(
        f""".:53 {{
    bind {net.node_ip}
    errors
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {dns_kc}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
    loadbalance
}}
"""
    )
    apply(_dns_service(net.node_ip))
    processes.start(d, "coredns", net.enter([bins["coredns"], "-conf", str(node / "Corefile")]))

    # ---- local-path-provisioner: the host's namespace, the API server on 127.0.0.1 -------------
    apply(_provisioner_objects(node / "volumes"))
    (node / "volumes").mkdir()
    from tests.support.cluster.cluster import write_kubeconfig

    lp = ca.issue("local-path", common_name="llmtrain:local-path-provisioner", groups=("system:masters",))
    lp_kc = write_kubeconfig(
        node / "local-path.kubeconfig",
        f"https://127.0.0.1:{api_port}",
        ca.cert,
        cert=lp.cert.read_bytes(),
        key=lp.key.read_bytes(),
    )
    (node / "local-path.json").write_text(json.dumps({"sharedFileSystemPath": str(node / "volumes")}))
    (node / "helper-pod.yaml").write_text(yaml.safe_dump(_helper_pod()))
    processes.start(
        d,
        "local-path-provisioner",
        [
            bins["local-path-provisioner"],
            "start",
            f"--kubeconfig={lp_kc}",
            f"--config={node / 'local-path.json'}",
            f"--helper-pod-file={node / 'helper-pod.yaml'}",
            f"--namespace={PROVISIONER_NAMESPACE}",
            f"--provisioner-name={PROVISIONER}",
            f"--helper-image={images.BUSYBOX_IMAGE}",
            "--service-account-name=local-path-provisioner",
            "--configmap-name=local-path-config",
        ],
    )
    return info


def load_image(info: NodeInfo, archive: Path, aliases: Sequence[str] = ()) -> bool:
    """Import an archive unless its image (same name, same manifest) is already in the store;
    True when it was imported. Other tags of the same repository go: each build of the trainer
    image has a tag of its own, and the shared store would otherwise keep every one (GBs each).
    `aliases` are further names for it, such as the published name a chart defaults to."""
    name, digest = images.archive_image(archive)
    present = images.listed(info.ctr, info.containerd_address)
    imported = not (name and present.get(name) == digest)
    if imported:
        images.import_archive(info.ctr, info.containerd_address, archive)
        if name:
            repository = name.rsplit(":", 1)[0]
            older = [ref for ref in present if ref != name and ref.rsplit(":", 1)[0] == repository]
            images.remove(info.ctr, info.containerd_address, older)
    for alias in aliases:
        if name and (imported or present.get(alias) != digest):
            images.tag(info.ctr, info.containerd_address, name, alias)
    return imported


def _take_image_store(node: Path) -> tuple[Path, int | None]:
    """containerd's root, where imported images are kept unpacked: the machine's shared store
    when no other cluster's node holds it (so a multi-GB image is imported once, not per session),
    else the node's own folder. The lock is an flock the caller hands to containerd.
    `LLMTRAIN_IMAGE_STORE=node` always takes the node's own folder."""
    own = node / "containerd" / "root"
    if os.environ.get("LLMTRAIN_IMAGE_STORE") == "node":
        return own, None
    shared = images.store_dir()
    shared.mkdir(parents=True, exist_ok=True)
    fd = os.open(shared / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return own, None
    return shared / "root", fd


# ---- configuration ---------------------------------------------------------------------------------
def _containerd_config(
    node: Path, info: NodeInfo, bins: dict[str, str], cni_bin: Path, cni_conf: Path
) -> str:
    return f"""version = 4
root = "{info.image_store}"
state = "{node / "containerd" / "state"}"
temp = "{node / "containerd" / "tmp"}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

# Every listener on a path of our own (version 4 moved them under plugins; the top-level
# [grpc] of version 3 would be ignored and containerd would take /run/containerd/containerd.sock).
[plugins."io.containerd.server.v1.grpc"]
  address = "{info.containerd_address}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{info.containerd_address}.ttrpc"

[plugins."io.containerd.server.v1.debug"]
  address = ""

[plugins."io.containerd.server.v1.metrics"]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{node / "containerd" / "opt"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{images.PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  # Pod network namespaces under the state folder, not /run/netns: teardown unmounts them there.
  netns_mounts_under_state_dir = true
  # This machine's root lacks CAP_SYS_RESOURCE: a negative oom_score_adj is refused, and without
  # this every sandbox fails ("failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bins["runc"]}"
        Root = "{node / "containerd" / "state" / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def _cni_config(node: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "llmtrain",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _dns_service(node_ip: str) -> list[dict[str, Any]]:
    """kube-dns with the usual ClusterIP, its endpoint the CoreDNS process on the node's IP."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": CLUSTER_DNS,
                "ports": [{"name": n, "port": 53, "protocol": p, "targetPort": 53} for n, p in ports],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-node",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "kube-dns"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
            "ports": [{"name": n, "port": 53, "protocol": p} for n, p in ports],
        },
    ]


def _provisioner_objects(volumes: Path) -> list[dict[str, Any]]:
    ns = PROVISIONER_NAMESPACE
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "local-path-provisioner", "namespace": ns},
        },
        {
            # The helper pod runs these from the ConfigMap it mounts (`/script/setup|teardown`),
            # with VOL_DIR set to the volume's folder as the pod sees it.
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", "namespace": ns},
            "data": {
                "setup": '#!/bin/sh\nset -eu\nmkdir -p "$VOL_DIR"\nchmod 0777 "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


def _helper_pod() -> dict[str, Any]:
    """local-path's helper pod (creates and removes volume folders), pinned to the real node: in
    shared-filesystem mode it names no node, and a kwok node would only pretend to run it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "priorityClassName": "system-node-critical",
            "containers": [{"name": "helper-pod", "image": images.BUSYBOX_IMAGE, "imagePullPolicy": "Never"}],
        },
    }


# ---- cgroups, sockets, teardown ---------------------------------------------------------------------
def _hierarchies() -> list[Path]:
    return [p for p in CGROUP_ROOT.iterdir() if (p / "cgroup.procs").exists()] if CGROUP_ROOT.is_dir() else []


def _make_cgroups(cgroup: str) -> None:
    """kubelet's --cgroup-root must exist in every hierarchy; cpuset needs its cpus/mems filled."""
    for h in _hierarchies():
        path = h / cgroup.lstrip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((h / name).read_text())


def _wait_socket(d: Path, sock: Path, component: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if component not in processes.running(d) or time.monotonic() > deadline:
            raise RuntimeError(
                f"{component} did not start; its log ends:\n{processes.tail(d / 'logs' / f'{component}.log')}"
            )
        time.sleep(0.2)


def _pids_in(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for h in _hierarchies():
        base = h / cgroup.lstrip("/")
        if base.is_dir():
            for procs in base.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    return pids


def _shim_pids(address: str) -> set[int]:
    """containerd's shims of this node (they leave containerd's session): `-address <our socket>`."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"-address" in argv and address.encode() in argv and b"-id" in argv:
                    found.add(int(proc.name))
    return found


def _shim_sockets(state: Path) -> list[Path]:
    """The shims' sockets: containerd puts them in /run/containerd/s/ whatever its configuration
    says, and a killed shim leaves its socket behind. Each task's bootstrap.json names its own."""
    found = []
    for bootstrap in state.glob("io.containerd.runtime.v2.task/*/*/bootstrap.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            address = str(json.loads(bootstrap.read_text())["address"])
            if address.startswith("unix:///run/containerd/s/"):
                found.append(Path(address.removeprefix("unix://")))
    return found


def stop(d: Path) -> None:
    """After the node's processes stopped: kill its containers and shims, unmount what kubelet and
    containerd mounted under the cluster folder, delete the namespace and the cgroups."""
    info = NodeInfo.load(d)
    if info is None:
        return
    sockets = _shim_sockets(d / "node" / "containerd" / "state")
    for _ in range(3):
        pids = _pids_in(info.cgroup) | _shim_pids(info.containerd_address)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    for sock in sockets:
        sock.unlink(missing_ok=True)
    for folder in (Path("/run/containerd/s"), Path("/run/containerd")):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: what our shims made, never another containerd's
    node = str((d / "node").resolve())
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for target in sorted({m for m in mounts if m.startswith(node + "/")}, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)
    netns.delete(info.netns)
    for h in _hierarchies():
        base = h / info.cgroup.lstrip("/")
        if base.is_dir():
            for sub in sorted(
                (p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()

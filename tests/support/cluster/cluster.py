"""A real Kubernetes control plane on this machine, from binaries built by hack/tools/build_tools.py.

etcd, kube-apiserver (RBAC, production admission plugins), kube-controller-manager (garbage
collector, Job and ServiceAccount controllers), kube-scheduler, kwok (fake kubelets for the fake
nodes), KubeRay's operator and Kueue's manager, each a local process. Pods are scheduled by the real
scheduler onto fake nodes and moved through their phases by kwok Stages. With `real_node=True`
one real node runs beside them (node.py: containerd, kubelet, kube-proxy, CoreDNS, local-path, in a
network namespace of its own), where containers really run.

`Cluster.up(directory)` starts everything and writes `<directory>/kubeconfig` (admin) and
`<directory>/cluster.json`; `Cluster.down(directory)` stops whatever is recorded there.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import builds
from tests.support.cluster import netns, nodes, pki, processes
from tests.support.cluster import node as real_node_m
from tests.support.cluster.kueue import prepare_kueue

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "hack" / "tools"))
import build_tools as tools  # noqa: E402

# Stopped in this order: controllers before the API server, etcd last.
STOP_ORDER = [
    "kueue",
    "kuberay",
    "ray-dashboard",
    *real_node_m.STOP_ORDER,
    "kwok",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
]
ADMISSION_PLUGINS = [
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "NodeRestriction",
    "TaintNodesByCondition",
    "PodSecurity",
    "Priority",
    "DefaultTolerationSeconds",
    "DefaultStorageClass",
    "StorageObjectInUseProtection",
    "PersistentVolumeClaimResize",
    "RuntimeClass",
    "CertificateApproval",
    "CertificateSigning",
    "ClusterTrustBundleAttest",
    "CertificateSubjectRestriction",
    "DefaultIngressClass",
    "OwnerReferencesPermissionEnforcement",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
]
STORAGE_CLASSES = ("kwok-volume", "shared-rwx")


# What every ServiceAccount of the platform namespace (the operator's identities) asks the API
# server, one JSON line per request once answered: how tests prove least privilege from the server's
# side (tests/support/cluster/audit.py). Beside them only status writes by ServiceAccounts (the
# trainers' progress reports) are logged.
PLATFORM_NAMESPACE = "llmtrain-system"
AUDIT_LOG = "audit.log"
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{PLATFORM_NAMESPACE}"]},
        # And who writes a job's status: the trainer, from inside its pod, with the per-job token.
        {
            "level": "Metadata",
            "userGroups": ["system:serviceaccounts"],
            "resources": [{"group": "llmtrain.dev", "resources": ["llmtrainingjobs/status"]}],
        },
        {"level": "None"},
    ],
}


class ClusterError(RuntimeError):
    pass


@dataclass
class Cluster:
    directory: Path
    server: str
    kubeconfig: Path
    bins: dict[str, str]
    dashboard: str
    kuberay_version: str
    kueue_version: str
    kubernetes_version: str
    real_node: bool = False

    # ---- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def up(cls, directory: Path, *, with_kueue: bool = True, real_node: bool = False) -> Cluster:
        """Start a cluster in `directory`; `real_node` adds a node where containers really run."""
        directory = directory.resolve()
        if processes.running(directory):
            raise ClusterError(f"a cluster is already running from {directory}: stop it first")
        real_node_m.stop(directory)  # what a killed session may have left: mounts, namespace
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        try:
            return cls._start(directory, with_kueue, real_node)
        except BaseException:
            cls.down(directory)
            raise

    @classmethod
    def load(cls, directory: Path) -> Cluster:
        data = json.loads((directory / "cluster.json").read_text())
        data["directory"] = Path(data["directory"])
        data["kubeconfig"] = Path(data["kubeconfig"])
        return cls(**data)

    @staticmethod
    def down(directory: Path) -> None:
        processes.stop_all(directory.resolve(), STOP_ORDER)
        real_node_m.stop(directory.resolve())

    @classmethod
    def _start(cls, d: Path, with_kueue: bool, with_real_node: bool) -> Cluster:
        builds.tools_built()
        bins: dict[str, str] = {}
        for tool in tools.tools():
            if tool == "kueue" and not with_kueue:
                continue  # not built for a cluster that never starts it
            folder = tools.ensure(tool)
            bins.update({name: str(folder / name) for name in tools.packages(tool)})
        # One folder a person can put on PATH: kubectl, helm, kwokctl... of the versions tested.
        (d / "bin").mkdir()
        for name, path in bins.items():
            (d / "bin" / name).symlink_to(path)
        pki_dir = d / "pki"
        ca = pki.CertificateAuthority(pki_dir)
        net = netns.create(d) if with_real_node else None
        serving = ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            hosts=(
                "127.0.0.1",
                "localhost",
                "10.96.0.1",
                # What pods may call the API server by (the real node's pods really do).
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                *real_node_m.apiserver_hosts(net),
            ),
        )
        kubelet_flags: list[str] = []
        if net is not None:
            # Towards the real kubelet (logs, exec): its InternalIP, its certificate from our CA, and
            # our identity. Only with a real node: kwok's fake nodes carry a made-up InternalIP.
            kubelet_client = ca.issue(
                "apiserver-kubelet-client", common_name="kube-apiserver", groups=("system:masters",)
            )
            kubelet_flags = [
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={ca.cert}",
            ]
        webhook = ca.issue("webhook", common_name="webhooks", hosts=("127.0.0.1", "localhost"))
        sa = pki.service_account_keys(pki_dir)
        port = processes.free_port
        etcd_port, peer_port, api_port, dashboard = port(), port(), port(), port()
        server = f"https://127.0.0.1:{api_port}"

        processes.start(
            d,
            "etcd",
            [
                bins["etcd"],
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        _wait_http(f"http://127.0.0.1:{etcd_port}/health", d, "etcd")

        def client(name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
            pair = ca.issue(name, common_name=user, groups=groups)
            return write_kubeconfig(
                d / f"{name}.kubeconfig",
                server,
                ca.cert,
                cert=pair.cert.read_bytes(),
                key=pair.key.read_bytes(),
            )

        admin = client("admin", "llmtrain-test-admin", ("system:masters",))
        (d / "logs").mkdir(exist_ok=True)
        (d / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        processes.start(
            d,
            "kube-apiserver",
            [
                bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                # With a real node, its pods reach the API server at the relay on the node's IP.
                f"--advertise-address={net.node_ip if net else '127.0.0.1'}",
                *kubelet_flags,
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                "--allow-privileged=true",
                f"--audit-policy-file={d / 'audit-policy.yaml'}",
                f"--audit-log-path={d / 'logs' / AUDIT_LOG}",
                "--audit-log-format=json",
                "--profiling=false",
                "--v=0",
            ],
        )
        _wait_http(f"{server}/readyz", d, "kube-apiserver", kubeconfig=admin, timeout=90)
        cm = client("controller-manager", "system:kube-controller-manager")
        processes.start(
            d,
            "kube-controller-manager",
            [
                bins["kube-controller-manager"],
                f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}",
                f"--authorization-kubeconfig={cm}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={ca.cert}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port()}",
                "--concurrent-gc-syncs=5",
            ],
        )
        scheduler = client("scheduler", "system:kube-scheduler")
        processes.start(
            d,
            "kube-scheduler",
            [
                bins["kube-scheduler"],
                f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}",
                f"--authorization-kubeconfig={scheduler}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port()}",
            ],
        )
        cluster = cls(
            directory=d,
            server=server,
            kubeconfig=admin,
            bins=bins,
            dashboard=f"http://127.0.0.1:{dashboard}",
            kuberay_version=tools.pinned_version("kuberay"),
            kueue_version=tools.pinned_version("kueue"),
            kubernetes_version=tools.pinned_version("kubernetes"),
            real_node=net is not None,
        )
        (d / "kubeconfig").write_bytes(admin.read_bytes())
        (d / "cluster.json").write_text(json.dumps(asdict(cluster), default=str, indent=2))

        # kwok: its Stage CRD, the stages, then the controller managing nodes annotated as fake.
        kwok_dir = tools.module_dir("kwok")
        cluster.apply_files([kwok_dir / "kustomize" / "crd" / "bases" / "kwok.x-k8s.io_stages.yaml"])
        cluster.wait_established("stages.kwok.x-k8s.io")
        cluster.apply(nodes.stages(kwok_dir, STORAGE_CLASSES))
        # With a real node its provisioner's class (local-path) is the default, else kwok's first.
        cluster.apply(nodes.storage_classes(STORAGE_CLASSES, default=net is None))
        if net is not None:
            real_node_m.start(d, net, api_port=api_port, bins=bins, ca=ca, apply=cluster.apply)
        kwok = client("kwok", "kwok-controller", ("system:masters",))
        processes.start(
            d,
            "kwok",
            [
                bins["kwok"],
                f"--kubeconfig={kwok}",
                "--enable-crds=Stage",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={nodes.FAKE_ANNOTATION}=fake",
                # Without a config file kwok's default is 0: no Leases, and the node lifecycle
                # controller marks every fake node NotReady ~50 s after its last heartbeat.
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.1/16",
                "--node-ip=10.0.0.10",
                f"--node-port={port()}",
                f"--server-address=127.0.0.1:{port()}",
            ],
        )
        cluster.apply(nodes.fake_nodes(beside_real_node=net is not None))
        # KubeRay: CRDs from its Go module, then its operator.
        ray_dir = tools.module_dir("kuberay")
        cluster.apply_files(sorted((ray_dir / "config" / "crd" / "bases").glob("ray.io_*.yaml")))
        for plural in ("rayjobs", "rayclusters", "rayservices"):
            cluster.wait_established(f"{plural}.ray.io")
        kuberay = client("kuberay", "kuberay-operator", ("system:masters",))
        dashboard_args = [f"--port={dashboard}"]
        if net is not None:
            # Requests for Services of the real node's pods (a real Ray head) go to them.
            reader = ca.issue(
                "ray-dashboard", common_name="llmtrain:ray-dashboard", groups=("system:masters",)
            )
            dashboard_args += [
                f"--netns={net.path}",
                f"--node-name={real_node_m.NODE_NAME}",
                f"--api-server={server}",
                f"--ca={ca.cert}",
                f"--cert={reader.cert}",
                f"--key={reader.key}",
            ]
        processes.start(
            d,
            "ray-dashboard",
            [sys.executable, "-m", "tests.support.cluster.ray_dashboard", *dashboard_args],
            env={"PYTHONPATH": str(REPO_ROOT)},
        )
        probe = port()
        processes.start(
            d,
            "kuberay",
            [
                bins["ray-operator"],
                f"--kubeconfig={kuberay}",
                f"--metrics-addr=127.0.0.1:{port()}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            # KubeRay's dashboard client is plain HTTP: the proxy sends it to the fake dashboard.
            env={"HTTP_PROXY": f"http://127.0.0.1:{dashboard}", "NO_PROXY": "127.0.0.1,localhost"},
        )
        if with_kueue:
            kueue_kubeconfig = client("kueue", "kueue-controller-manager", ("system:masters",))
            setup = prepare_kueue(
                binary=Path(bins["kueue"]),
                module_dir=tools.module_dir("kueue"),
                workdir=d / "kueue",
                kubeconfig=kueue_kubeconfig,
                ca_cert=ca.cert,
                serving_cert=webhook.cert,
                serving_key=webhook.key,
                ports=port,
            )
            cluster.apply(setup.manifests)
            for crd in setup.manifests:
                if crd["kind"] == "CustomResourceDefinition":
                    cluster.wait_established(crd["metadata"]["name"])
            processes.start(d, "kueue", setup.command, env=setup.env)
            _wait_http(setup.health_url, d, "kueue", timeout=90)
        _wait_http(f"http://127.0.0.1:{probe}/readyz", d, "kuberay", timeout=60)
        cluster.wait_nodes_ready([n["metadata"]["name"] for n in nodes.fake_nodes()])
        if net is not None:
            cluster.wait_nodes_ready([real_node_m.NODE_NAME], timeout=180)
        return cluster

    # ---- use -----------------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.bins["kubectl"], f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def apply(self, objects: Iterable[dict[str, Any]], *, field_manager: str = "llmtrain-tests") -> None:
        docs = list(objects)
        if docs:
            text = yaml.safe_dump_all(docs)
            self.kubectl(
                "apply",
                "--server-side",
                f"--field-manager={field_manager}",
                "--force-conflicts",
                "-f",
                "-",
                input=text,
            )

    def apply_files(self, files: Iterable[Path]) -> None:
        for f in files:
            self.kubectl("apply", "--server-side", "--field-manager=llmtrain-tests", "-f", str(f))

    def wait_established(self, crd: str, timeout: float = 30) -> None:
        # `kubectl wait` fails at once (rather than waiting) while a new CRD has no conditions yet.
        deadline = time.monotonic() + timeout
        while True:
            result = self.kubectl(
                "wait",
                "--for=condition=Established",
                f"crd/{crd}",
                f"--timeout={int(timeout)}s",
                timeout=timeout + 10,
                check=False,
            )
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {crd} not established: {result.stderr.strip()}")
            time.sleep(0.2)

    def wait_nodes_ready(self, names: list[str], timeout: float = 60) -> None:
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            *(f"node/{n}" for n in names),
            f"--timeout={int(timeout)}s",
            timeout=timeout + 10,
        )

    def token(self, service_account: str, namespace: str, duration: str = "1h") -> str:
        """A bearer token for a ServiceAccount from the TokenRequest API."""
        out = self.kubectl("create", "token", service_account, "-n", namespace, f"--duration={duration}")
        return out.stdout.strip()

    def kubeconfig_for_token(self, path: Path, token: str, namespace: str | None = None) -> Path:
        ca = (self.directory / "pki" / "ca.crt").read_bytes()
        return write_kubeconfig(path, self.server, ca_data=ca, token=token, namespace=namespace)

    def load_image(self, archive: Path, aliases: Sequence[str] = ()) -> bool:
        """Import an OCI image-layout (or docker-save) tar into the real node's containerd; False
        when the image was there already (the shared store keeps images between sessions).
        `aliases` are further names for it (tagged in containerd)."""
        info = real_node_m.NodeInfo.load(self.directory)
        if info is None:
            raise ClusterError("this cluster has no real node (Cluster.up(..., real_node=True))")
        return real_node_m.load_image(info, archive, aliases)

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / AUDIT_LOG

    def logs(self, component: str, lines: int = 40) -> str:
        return processes.tail(self.directory / "logs" / f"{component}.log", lines)


def write_kubeconfig(
    path: Path,
    server: str,
    ca_file: Path | None = None,
    *,
    ca_data: bytes | None = None,
    cert: bytes | None = None,
    key: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    ca = ca_data if ca_data is not None else (ca_file.read_bytes() if ca_file else b"")
    user: dict[str, str] = {}
    if cert and key:
        user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    if token:
        user = {"token": token}
    context: dict[str, str] = {"cluster": "llmtrain-test", "user": "user"}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "llmtrain-test", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "llmtrain-test", "context": context}],
        "current-context": "llmtrain-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _wait_http(
    url: str, d: Path, component: str, *, kubeconfig: Path | None = None, timeout: float = 30
) -> None:
    """Poll a health endpoint until it answers 200; fail with the component's log tail."""
    context: ssl.SSLContext | None = None
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=str(d / "pki" / "ca.crt"))
        if kubeconfig is not None:
            context.load_cert_chain(str(d / "pki" / "admin.crt"), str(d / "pki" / "admin.key"))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if component not in processes.running(d):
            break
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.3)
    log = processes.tail(d / "logs" / f"{component}.log")
    raise ClusterError(f"{component} did not become healthy at {url} ({last}); its log ends:\n{log}")


def default_directory() -> Path:
    return Path(os.environ.get("LLMTRAIN_CLUSTER_DIR", REPO_ROOT / ".cluster"))

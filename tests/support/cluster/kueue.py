"""Run Kueue v0.19.2's manager as a local process against the local kube-apiserver.

Everything listens on 127.0.0.1: the API server reaches the webhooks (admission and CRD conversion)
by URL with our CA as caBundle, since there is no Service or cluster DNS. Kueue's internal cert
management is off because its certificates name `kueue-webhook-service.kueue-system.svc`, which
the API server cannot verify at 127.0.0.1; our serving certificate is used instead.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from tests.support.cluster import processes

NAMESPACE = "kueue-system"
API = "kueue.x-k8s.io/v1beta2"  # the storage version of every Kueue CRD in v0.19.2
FRAMEWORKS = ["ray.io/rayjob", "ray.io/raycluster"]  # batch/job is only Kueue's default, not required
# main.go reads the metrics serving pair from this fixed path whenever internal cert management is
# off (no flag or config field moves it) and exits at start if it is missing.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
# What config/components/webhook/kustomization.yaml gives every job framework's webhook.
_JOB_NAMESPACES = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    ]
}
ClientConfig = Callable[[str], dict[str, Any]]
_RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class KueueSetup:
    """What to apply (server-side, in order), start and poll; the caller owns the process."""

    manifests: list[dict[str, Any]]
    command: list[str]
    env: dict[str, str]
    health_url: str


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crds(crd_dir: Path, client_config: ClientConfig) -> list[dict[str, Any]]:
    """The CRD bases with kustomization.yaml's conversion patches applied, pointed at our URL.

    v1beta1 is still served beside the v1beta2 storage version, so LocalQueue, ClusterQueue,
    Cohort, Workload and MultiKueueCluster keep their conversion webhook (path /convert).
    """
    crds = [d for f in sorted((crd_dir / "bases").glob("*.yaml")) for d in _load(f)]
    by_name = {c["metadata"]["name"]: c for c in crds}
    for patch in yaml.safe_load((crd_dir / "kustomization.yaml").read_text()).get("patches", []):
        for doc in _load(crd_dir / patch["path"]):
            conversion = doc.get("spec", {}).get("conversion")
            if conversion:
                webhook = conversion["webhook"]
                webhook["clientConfig"] = client_config(webhook["clientConfig"]["service"]["path"])
                by_name[doc["metadata"]["name"]]["spec"]["conversion"] = conversion
    return crds


def _webhooks(path: Path, frameworks: list[str], client_config: ClientConfig) -> list[dict[str, Any]]:
    """Kueue's own webhooks and the enabled frameworks', renamed as the kustomize install names them.

    Webhooks for disabled frameworks (pods, deployments, ...) are dropped: Kueue would only answer
    them with a no-op, but with failurePolicy Fail they would block those kinds whenever it is down.
    """
    enabled = {(f.split("/")[0], f.split("/")[1] + "s") for f in frameworks}  # ("ray.io", "rayjobs")
    docs = _load(path)
    for doc in docs:
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        kept = []
        for hook in doc["webhooks"]:
            rules = hook["rules"]
            targets = {
                (g, r.split("/")[0]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            }
            if targets <= enabled:
                hook["namespaceSelector"] = copy.deepcopy(_JOB_NAMESPACES)  # no YAML aliases
            elif any(g != "kueue.x-k8s.io" for g, _ in targets):
                continue
            hook["clientConfig"] = client_config(hook["clientConfig"]["service"]["path"])
            kept.append(hook)
        doc["webhooks"] = kept
    return docs


def _kubeconfig_user(kubeconfig: Path) -> str | None:
    """The user the API server sees for the kubeconfig's client certificate (its CN), if it has one."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    current = cfg.get("current-context")
    ctx: dict[str, Any] = next((c["context"] for c in cfg.get("contexts", []) if c["name"] == current), {})
    user: dict[str, Any] = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {})
    if "client-certificate-data" in user:
        pem = base64.b64decode(user["client-certificate-data"])
    elif "client-certificate" in user:
        pem = (kubeconfig.parent / user["client-certificate"]).read_bytes()
    else:
        return None
    names = x509.load_pem_x509_certificate(pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


def _rbac(rbac_dir: Path, user: str) -> list[dict[str, Any]]:
    """The manager's ClusterRole, its secrets Role (MultiKueue) and metrics auth role, bound to `user`."""
    out: list[dict[str, Any]] = []
    for name in ("role.yaml", "manager_secrets_role.yaml", "metrics_auth_role.yaml"):
        for role in _load(rbac_dir / name):
            role["metadata"]["name"] = "kueue-" + role["metadata"]["name"]
            ref = {"apiGroup": _RBAC, "kind": role["kind"], "name": role["metadata"]["name"]}
            binding = {
                "apiVersion": f"{_RBAC}/v1",
                "kind": role["kind"] + "Binding",
                "metadata": {"name": ref["name"] + "binding"},
                "subjects": [{"apiGroup": _RBAC, "kind": "User", "name": user}],
                "roleRef": ref,
            }
            if role["kind"] == "Role":
                role["metadata"]["namespace"] = binding["metadata"]["namespace"] = NAMESPACE
            out += [role, binding]
    return out


def _install_metrics_certs(cert: Path, key: Path) -> None:
    """Put a serving pair where main.go insists on finding one; any valid pair already there is kept.

    The pair is staged in a sibling folder and renamed into place, so concurrent runs never mix
    one run's certificate with another's key.
    """
    if (METRICS_CERT_DIR / "tls.crt").is_file() and (METRICS_CERT_DIR / "tls.key").is_file():
        return
    try:
        METRICS_CERT_DIR.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".certs-", dir=METRICS_CERT_DIR.parent))
    except PermissionError as e:
        raise RuntimeError(f"Kueue needs {METRICS_CERT_DIR}/tls.{{crt,key}}; create it or run as root") from e
    shutil.copyfile(cert, staging / "tls.crt")
    shutil.copyfile(key, staging / "tls.key")
    try:
        staging.rename(METRICS_CERT_DIR)
    except OSError:  # another run installed its pair first
        shutil.rmtree(staging)


def prepare_kueue(
    *,
    binary: Path,
    module_dir: Path,
    workdir: Path,
    kubeconfig: Path,
    ca_cert: Path,
    serving_cert: Path,
    serving_key: Path,
    ports: Callable[[], int],
) -> KueueSetup:
    """Write Kueue's config and cert dir into `workdir`; return what to apply and how to start it."""
    components = module_dir / "config" / "components"
    webhook_port, health_port, metrics_port, visibility_port = ports(), ports(), ports(), ports()
    ca_bundle = base64.b64encode(ca_cert.read_bytes()).decode()

    def client_config(path: str) -> dict[str, Any]:
        return {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}

    workdir.mkdir(parents=True, exist_ok=True)
    cert_dir = workdir / "webhook-certs"
    cert_dir.mkdir(exist_ok=True)
    shutil.copyfile(serving_cert, cert_dir / "tls.crt")  # controller-runtime's default CertName/KeyName
    shutil.copyfile(serving_key, cert_dir / "tls.key")
    _install_metrics_certs(serving_cert, serving_key)

    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        # On by default; with internal certs off it reads /visibility/tls.crt and exits if absent, and
        # its APIService would need a Service. The bind settings only matter if someone turns it on.
        "featureGates": {"VisibilityOnDemand": False},
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": visibility_port},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": FRAMEWORKS},
    }
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    user = _kubeconfig_user(kubeconfig)
    manifests = [
        *_crds(components / "crd", client_config),
        namespace,
        *(_rbac(components / "rbac", user) if user else []),
        *_webhooks(components / "webhook" / "manifests.yaml", FRAMEWORKS, client_config),
    ]
    return KueueSetup(
        manifests=manifests,
        # --kubeconfig is controller-runtime's flag (it wins over $KUBECONFIG); both are set so the
        # manager never falls back to in-cluster config.
        command=[str(binary), f"--config={config_path}", f"--kubeconfig={kubeconfig}"],
        env={"KUBECONFIG": str(kubeconfig)},
        health_url=f"http://127.0.0.1:{health_port}/readyz",
    )


def kueue_queue_objects(
    *, cluster_queue: str, local_queue: str, namespace: str, flavor: str, gpus: int, cpus: str, memory: str
) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue open to every namespace, and a LocalQueue feeding it."""
    quotas = {"cpu": cpus, "memory": memory, "nvidia.com/gpu": gpus}
    resources = [{"name": name, "nominalQuota": quota} for name, quota in quotas.items()]
    group = {"coveredResources": list(quotas), "flavors": [{"name": flavor, "resources": resources}]}
    return [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {"namespaceSelector": {}, "resourceGroups": [group]},
        },
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


@contextlib.contextmanager
def kueue_configured(directory: Path, changes: dict[str, Any]) -> Iterator[None]:
    """Kueue's manager restarted with `changes` merged into its Configuration, and restarted with
    the tier's own after. For a setting that would change every other test's jobs (Kueue v0.19.2
    applies managedJobsNamespaceSelector to queued jobs too, so manageJobsWithoutQueueName cannot
    be narrowed to one namespace)."""
    config_path = directory / "kueue" / "kueue-config.yaml"
    original = config_path.read_text()
    pid = processes.running(directory)["kueue"]
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
    kubeconfig = next(a.split("=", 1)[1] for a in argv if a.startswith("--kubeconfig="))
    health = f"http://{yaml.safe_load(original)['health']['healthProbeBindAddress']}/readyz"

    def restart(text: str) -> None:
        config_path.write_text(text)
        processes.stop(directory, "kueue")
        processes.start(directory, "kueue", argv, env={"KUBECONFIG": kubeconfig})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(health, timeout=5) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(
            f"Kueue did not become ready again:\n{processes.tail(directory / 'logs' / 'kueue.log')}"
        )

    restart(yaml.safe_dump({**yaml.safe_load(original), **changes}, sort_keys=False))
    try:
        yield
    finally:
        restart(original)

"""The trainer's status-reporting identity, two designs measured on a real control plane (issue #22):

- per job (earlier operators): a ServiceAccount, a Role allowing `patch` on its own job's status
  (`resourceNames`) and a RoleBinding, all created by the operator for every job;
- per namespace (the operator now): one reporter Role and RoleBinding (the namespace's
  ServiceAccounts, as a group, `render_reporter_rbac`) created once, and the chart's reporter
  ValidatingAdmissionPolicy that refuses a ServiceAccount's status patch of any job but the one
  named after it (`<job>-trainer`).

Printed, in the same run and interleaved, so the machine's load is the same for both: the
operator's per-job creates (as the chart's ServiceAccount, whose Role/RoleBinding creates pass
the API server's privilege-escalation check), a trainer token's own status patch under each
design, and whether a trainer token can patch another job's status (it must not, in either).
Run with a cluster up: `python benchmarks/reporter_rbac.py --cluster-dir DIR` (the chart installed,
e.g. after `benchmarks/operator_throughput.py --cluster-dir DIR`)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from llmtrain.constants import GROUP_VERSION, JOB_LABEL, MANAGED_BY_LABEL, OPERATOR_NAME  # noqa: E402
from llmtrain.render.rbac import render_reporter_rbac, reporter_rules  # noqa: E402

from tests.support.cluster.cluster import Cluster  # noqa: E402
from tests.support.cluster.steps import OPERATOR_SA, PLATFORM_NAMESPACE  # noqa: E402
from tests.support.jobs import minimal_job  # noqa: E402

RBAC = "rbac.authorization.k8s.io/v1"


def kube_for(cluster: Cluster, token: str, path: Path) -> Any:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from llmtrain.operator.kube import Kube

    configuration = k8s_client.Configuration()
    kubeconfig = cluster.kubeconfig_for_token(path, token)
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return Kube(k8s_client.ApiClient(configuration))


def meta(name: str, namespace: str, job: str) -> dict[str, Any]:
    """Labelled as the operator's own children (the chart's containment policy admits no others)."""
    return {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: OPERATOR_NAME, JOB_LABEL: job}}


def timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - started) * 1000


def role(name: str, namespace: str, job: str) -> dict[str, Any]:
    """The per-job design's trainer Role: the reporter rule confined to its own job."""
    rules = [{**rule, "resourceNames": [job]} for rule in reporter_rules()]
    return {"apiVersion": RBAC, "kind": "Role", "metadata": meta(name, namespace, job), "rules": rules}


def binding(name: str, namespace: str, job: str, subject: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "RoleBinding",
        "metadata": meta(name, namespace, job),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [subject],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    from llmtrain.operator.kube import RESOURCES, ApiError

    jobs_res = RESOURCES[(GROUP_VERSION, "LLMTrainingJob")]
    cluster = Cluster.load(args.cluster_dir.resolve())
    tmp = Path(tempfile.mkdtemp(prefix="reporter-rbac-"))
    stamp = int(time.time())
    per_job, per_ns = f"rbac-job-{stamp}", f"rbac-ns-{stamp}"
    cluster.apply(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (per_job, per_ns)]
    )
    operator = kube_for(cluster, cluster.token(OPERATOR_SA, PLATFORM_NAMESPACE), tmp / "operator")
    times: dict[str, list[float]] = {k: [] for k in ("sa", "role", "binding", "sa-ns", "once-ns")}
    # Once per namespace, as the operator makes them (the chart's containment policy admits them).
    started = time.perf_counter()
    for obj in render_reporter_rbac(per_ns):
        operator.create(obj)
    times["once-ns"].append((time.perf_counter() - started) * 1000)
    for i in range(args.jobs):  # interleaved: the same load for both designs
        name = f"j{i:03d}"
        sa = f"{name}-trainer"
        account = {"kind": "ServiceAccount", "name": sa, "namespace": per_job}
        times["sa"].append(
            timed(
                operator.create,
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": meta(sa, per_job, name),
                },
            )
        )
        times["role"].append(timed(operator.create, role(sa, per_job, name)))
        times["binding"].append(timed(operator.create, binding(sa, per_job, name, account)))
        times["sa-ns"].append(
            timed(
                operator.create,
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(sa, per_ns, name)},
            )
        )
    for ns in (per_job, per_ns):
        cluster.apply([minimal_job(f"j{i:03d}", ns) for i in range(min(args.jobs, 10))])
    patches: dict[str, list[float]] = {per_job: [], per_ns: []}
    refused: dict[str, bool] = {}
    for i in range(min(args.jobs, 10)):
        for ns in (per_job, per_ns):
            name = f"j{i:03d}"
            trainer = kube_for(cluster, cluster.token(f"{name}-trainer", ns), tmp / f"{ns}-{name}")
            body = {"status": {"progress": {"step": i}}}
            patches[ns].append(timed(trainer.merge_patch, jobs_res, ns, name, body, "status"))
            other = f"j{(i + 1) % min(args.jobs, 10):03d}"
            try:
                trainer.merge_patch(jobs_res, ns, other, body, "status")
                refused[ns] = False
            except ApiError as err:
                refused.setdefault(ns, err.status in (403, 422))  # RBAC, or the policy (Invalid)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"operator, per job, median ms as its ServiceAccount: ServiceAccount {med['sa']:.0f}, "
        f"Role {med['role']:.0f}, RoleBinding {med['binding']:.0f} (per-job design: "
        f"{med['sa'] + med['role'] + med['binding']:.0f}); per-namespace design: ServiceAccount "
        f"{med['sa-ns']:.0f} per job, Role+RoleBinding once (as the operator) {med['once-ns']:.0f}"
    )
    print(
        "trainer status patch, median ms: per-job RBAC "
        f"{statistics.median(patches[per_job]):.0f}, per-namespace Role + admission policy "
        f"{statistics.median(patches[per_ns]):.0f}; another job's status refused: "
        f"per-job {refused.get(per_job)}, per-namespace {refused.get(per_ns)}"
    )
    cluster.kubectl("delete", "namespace", per_job, per_ns, "--wait=false", check=False)


if __name__ == "__main__":
    main()

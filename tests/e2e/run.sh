#!/usr/bin/env bash
# End-to-end test of the llmtrain platform on a throwaway kind cluster (`make e2e`).
#
# Creates a kind cluster, builds and loads the operator and trainer images, installs KubeRay
# v1.7.0 from its chart and llmtrain from charts/llmtrain, then runs examples/tiny-cpu.yaml the way
# its header says: `llmtrain upload` puts examples/data/ on the claim the example names
# (spec.storage.claimName), which this script creates first as ReadWriteOnce (kind's local-path
# has no ReadWriteMany; its one node lets every pod mount it), and the example is applied
# unchanged. Then it checks the phase, the progress column, the checkpoints and the export,
# deletes the job, checks its RayJob is garbage-collected, and deletes the cluster.
#
# Needs docker, kind, helm, kubectl and the llmtrain CLI (`make install` puts it in .venv), and a
# Docker host with about 4 CPUs and 10 GiB of memory: the job asks for 1.7 CPUs and 7.25 GiB (head,
# 2 workers and KubeRay's submitter); kind's control plane and the operators about 1.2 CPUs more.
#
# Usage: tests/e2e/run.sh [--dry-run] [--keep-cluster] [--help]
#   --dry-run       print the commands it would run, run nothing
#   --keep-cluster  leave the kind cluster up afterwards (also on failure), for debugging
# Environment: LLMTRAIN_E2E_CLUSTER (kind cluster name, default llmtrain-e2e),
#   LLMTRAIN_E2E_JOB_TIMEOUT (seconds to wait for the job to succeed, default 2400),
#   LLMTRAIN (the llmtrain CLI, default .venv/bin/llmtrain, else llmtrain on PATH).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"

CLUSTER="${LLMTRAIN_E2E_CLUSTER:-llmtrain-e2e}"
CONTEXT="kind-${CLUSTER}"
JOB_TIMEOUT="${LLMTRAIN_E2E_JOB_TIMEOUT:-2400}"
OPERATOR_IMAGE="ghcr.io/llmtrain/operator:e2e"
TRAINER_IMAGE="ghcr.io/llmtrain/trainer:e2e" # also named in tests/e2e/manifests/storage.yaml
KUBERAY_VERSION="1.7.0"
KUBERAY_REPO="https://ray-project.github.io/kuberay-helm/"
SYSTEM_NS="llmtrain-system"
JOB_NS="llmtrain-e2e"
JOB="tiny-cpu"
EXAMPLE="examples/tiny-cpu.yaml" # applied as it is
CLAIM="llmtrain-data" # the example's storage.claimName, also named in tests/e2e/manifests/storage.yaml
MOUNT="/mnt/llmtrain" # the example's storage.mountPath (the API default)
DATA_DIR="data" # where the example's dataset.path (data/tiny-stories.txt) is, inside the claim
JOB_DIR="${MOUNT}/runs/${JOB_NS}/${JOB}" # the job's runs: one per uid, <JOB_DIR>/<metadata.uid>
CHECKPOINT_GLOB="checkpoint-step-*" # the trainer's checkpoint directories (llmtrain_trainer.rundir)
EXPORT_DIR="export"

DRY_RUN=0
KEEP_CLUSTER=0
CLUSTER_CREATED=0

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

log() {
  printf '\n==> %s\n' "$*"
}

# Print a command shell-quoted, then run it unless --dry-run.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if ((DRY_RUN)); then
    return 0
  fi
  "$@"
}

k() {
  run kubectl --context "$CONTEXT" "$@"
}

# kubectl whose output the script reads; prints the command, returns nothing in --dry-run.
k_out() {
  printf '+ kubectl --context %q' "$CONTEXT" >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  if ((DRY_RUN)); then
    return 0
  fi
  kubectl --context "$CONTEXT" "$@"
}

h() {
  run helm --kube-context "$CONTEXT" "$@"
}

fail() {
  printf '\nFAILED: %s\n' "$*" >&2
  exit 1
}

llmtrain_bin() {
  if [[ -n "${LLMTRAIN:-}" ]]; then
    printf '%s\n' "$LLMTRAIN"
  elif [[ -x "$REPO_ROOT/.venv/bin/llmtrain" ]]; then
    printf '%s\n' ".venv/bin/llmtrain"
  else
    printf '%s\n' "llmtrain"
  fi
}

preflight() {
  local missing=()
  local tool
  for tool in docker kind helm kubectl "$(llmtrain_bin)"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    if ((DRY_RUN)); then
      printf '# note: not installed here: %s (a real run needs them)\n' "${missing[*]}"
      return 0
    fi
    fail "missing tools: ${missing[*]} (install docker, kind, helm and kubectl; make install for llmtrain)"
  fi
  ((DRY_RUN)) && return 0
  docker info >/dev/null 2>&1 || fail "docker is installed but its daemon is not reachable"
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    fail "a kind cluster named $CLUSTER exists already: delete it (kind delete cluster --name $CLUSTER) or set LLMTRAIN_E2E_CLUSTER"
  fi
}

diagnostics() {
  printf '\n==> diagnostics\n' >&2
  kubectl --context "$CONTEXT" get llmtrainingjobs,rayjobs,rayclusters,pods,pvc -A -o wide >&2 || true
  kubectl --context "$CONTEXT" -n "$JOB_NS" describe llmtrainingjob "$JOB" >&2 || true
  kubectl --context "$CONTEXT" -n "$SYSTEM_NS" logs deployment/llmtrain-operator --tail=200 >&2 || true
  kubectl --context "$CONTEXT" -n kuberay-system logs deployment/kuberay-operator --tail=50 >&2 || true
  kubectl --context "$CONTEXT" get events -A --sort-by=.lastTimestamp >&2 || true
}

cleanup() {
  local status=$?
  if ((DRY_RUN)); then
    return
  fi
  if ((status != 0 && CLUSTER_CREATED)); then
    diagnostics
  fi
  if ((CLUSTER_CREATED && !KEEP_CLUSTER)); then
    kind delete cluster --name "$CLUSTER" || true
  elif ((CLUSTER_CREATED)); then
    printf '\nkept the cluster: kubectl --context %s ... ; delete it with: kind delete cluster --name %s\n' \
      "$CONTEXT" "$CLUSTER"
  fi
  exit "$status"
}

create_cluster() {
  log "kind cluster $CLUSTER"
  run kind create cluster --name "$CLUSTER" --config tests/e2e/kind-config.yaml --wait 180s
  CLUSTER_CREATED=1
}

build_images() {
  log "images (build context: repository root)"
  run docker build -f operator/Dockerfile -t "$OPERATOR_IMAGE" .
  run docker build -f trainer_image/Dockerfile -t "$TRAINER_IMAGE" .
  run kind load docker-image "$OPERATOR_IMAGE" "$TRAINER_IMAGE" --name "$CLUSTER"
}

install_kuberay() {
  log "KubeRay v${KUBERAY_VERSION} from its chart"
  h install kuberay-operator kuberay-operator --repo "$KUBERAY_REPO" --version "$KUBERAY_VERSION" \
    --namespace kuberay-system --create-namespace --wait --timeout 5m
}

install_llmtrain() {
  log "llmtrain from charts/llmtrain"
  k create namespace "$SYSTEM_NS"
  # The operator must run under the restricted Pod Security profile: enforce it.
  k label namespace "$SYSTEM_NS" pod-security.kubernetes.io/enforce=restricted
  h install llmtrain charts/llmtrain --namespace "$SYSTEM_NS" \
    --set image.tag=e2e --set trainerImage.tag=e2e --set logLevel=debug \
    --set kuberay.requireCRDs=true --wait --timeout 5m
  k -n "$SYSTEM_NS" rollout status deployment/llmtrain-operator --timeout 180s
}

prepare_storage() {
  log "claim $CLAIM (ReadWriteOnce), examples/data/ put on it by llmtrain upload"
  k create namespace "$JOB_NS"
  k label namespace "$JOB_NS" pod-security.kubernetes.io/warn=restricted
  k -n "$JOB_NS" apply -f tests/e2e/manifests/storage.yaml
  # The example's own command, less --size: the claim exists, so upload only copies (and checks
  # every file's size); with --size on a missing claim it would create one ReadWriteMany.
  run "$(llmtrain_bin)" upload examples/data --claim "$CLAIM" --to "$DATA_DIR" --image "$TRAINER_IMAGE" \
    --namespace "$JOB_NS" --context "$CONTEXT"
  k -n "$JOB_NS" wait --for=condition=Ready pod/storage-shell --timeout 300s
  k -n "$JOB_NS" exec storage-shell -c shell -- test -s "${MOUNT}/${DATA_DIR}/tiny-stories.txt"
}

submit_job() {
  log "job $JOB ($EXAMPLE as it is)"
  k -n "$JOB_NS" apply -f "$EXAMPLE"
}

wait_for_success() {
  log "waiting up to ${JOB_TIMEOUT}s for phase Succeeded"
  local deadline phase="" summary="" message="" seen_progress=0 now
  deadline=$((SECONDS + JOB_TIMEOUT))
  while :; do
    phase="$(k_out -n "$JOB_NS" get llmtrainingjob "$JOB" -o 'jsonpath={.status.phase}' || true)"
    summary="$(k_out -n "$JOB_NS" get llmtrainingjob "$JOB" -o 'jsonpath={.status.progress.summary}' || true)"
    k -n "$JOB_NS" get llmtj || true
    ((DRY_RUN)) && return 0
    [[ -n "$summary" ]] && seen_progress=1
    case "$phase" in
      Succeeded) break ;;
      Failed)
        message="$(kubectl --context "$CONTEXT" -n "$JOB_NS" get llmtj "$JOB" -o 'jsonpath={.status.message}' || true)"
        fail "the job failed: $message"
        ;;
      *) ;; # no status yet, Pending, Initializing, Running
    esac
    now=$SECONDS
    ((now < deadline)) || fail "the job did not succeed within ${JOB_TIMEOUT}s (phase: ${phase:-none})"
    sleep 20
  done
  ((seen_progress)) || fail "status.progress.summary was never set"
  # `kubectl get llmtj` shows progress: the Progress column carries status.progress.summary.
  k_out -n "$JOB_NS" get llmtj "$JOB" | grep -F -- "$summary" >/dev/null ||
    fail "kubectl get llmtj does not show the progress $summary"
  printf 'job %s succeeded, progress %s\n' "$JOB" "$summary"
}

check_outputs() {
  local uid checkpoints exported
  uid="$(k_out -n "$JOB_NS" get llmtrainingjob "$JOB" -o 'jsonpath={.metadata.uid}')"
  RUN_DIR="$JOB_DIR/${uid:-UID}"
  log "checkpoints and export under $RUN_DIR"
  checkpoints="$(k_out -n "$JOB_NS" exec storage-shell -c shell -- \
    find "$RUN_DIR" -maxdepth 1 -type d -name "$CHECKPOINT_GLOB")"
  exported="$(k_out -n "$JOB_NS" exec storage-shell -c shell -- find "$RUN_DIR/$EXPORT_DIR" -type f)"
  ((DRY_RUN)) && return 0
  [[ -n "$checkpoints" ]] || fail "no $CHECKPOINT_GLOB directory in $RUN_DIR"
  [[ -n "$exported" ]] || fail "no exported model in $RUN_DIR/$EXPORT_DIR"
  printf 'checkpoints:\n%s\nexport:\n%s\n' "$checkpoints" "$exported"
}

delete_job() {
  log "delete the job; its RayJob must go with it"
  local rayjobs deadline
  rayjobs="$(k_out -n "$JOB_NS" get rayjobs -l "llmtrain.dev/job=$JOB" -o name)"
  if ((!DRY_RUN)) && [[ -z "$rayjobs" ]]; then
    fail "no RayJob labelled llmtrain.dev/job=$JOB before deletion"
  fi
  k -n "$JOB_NS" delete llmtrainingjob "$JOB" --wait=true --timeout 120s
  ((DRY_RUN)) && return 0
  deadline=$((SECONDS + 180))
  while :; do
    rayjobs="$(k_out -n "$JOB_NS" get rayjobs -l "llmtrain.dev/job=$JOB" -o name || printf 'unknown')"
    [[ -z "$rayjobs" ]] && break
    ((SECONDS < deadline)) || fail "RayJob still present 180s after the job was deleted: $rayjobs"
    sleep 5
  done
  printf 'RayJob of %s is gone\n' "$JOB"
}

delete_cluster() {
  ((KEEP_CLUSTER)) && return 0
  log "delete the kind cluster"
  run kind delete cluster --name "$CLUSTER"
  CLUSTER_CREATED=0
}

main() {
  while (($#)); do
    case "$1" in
      --dry-run) DRY_RUN=1 ;;
      --keep-cluster) KEEP_CLUSTER=1 ;;
      -h | --help)
        usage
        return 0
        ;;
      *)
        usage >&2
        fail "unknown argument: $1"
        ;;
    esac
    shift
  done
  trap cleanup EXIT
  ((DRY_RUN)) && printf '# dry run: printing the commands of a real run, running none\n'
  preflight
  create_cluster
  build_images
  install_kuberay
  install_llmtrain
  prepare_storage
  submit_job
  wait_for_success
  check_outputs
  delete_job
  delete_cluster
  if ((DRY_RUN)); then
    log "dry run done"
  else
    log "e2e passed"
  fi
}

main "$@"

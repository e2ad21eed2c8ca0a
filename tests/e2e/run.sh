#!/usr/bin/env bash
# End-to-end test of the llmtrain platform on a throwaway kind cluster (`make e2e`).
#
# Creates a kind cluster, builds and loads the operator and trainer images, installs KubeRay
# v1.7.0 from its chart and llmtrain from charts/llmtrain, trains examples/tiny-cpu.yaml against a
# pre-filled ReadWriteOnce claim, checks the phase, the progress column, the checkpoints and the
# export, deletes the job, checks its RayJob is garbage-collected, and deletes the cluster.
#
# Needs docker, kind, helm, kubectl and python3 with PyYAML (the repository's .venv has it), and a
# Docker host with about 6 CPUs and 8 GiB of memory: the job asks for 3 CPUs and 6 GiB.
#
# Usage: tests/e2e/run.sh [--dry-run] [--keep-cluster] [--help]
#   --dry-run       print the commands it would run, run nothing
#   --keep-cluster  leave the kind cluster up afterwards (also on failure), for debugging
# Environment: LLMTRAIN_E2E_CLUSTER (kind cluster name, default llmtrain-e2e),
#   LLMTRAIN_E2E_JOB_TIMEOUT (seconds to wait for the job to succeed, default 2400),
#   PYTHON (interpreter for make_job.py, default .venv/bin/python, else python3).
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
CLAIM="tiny-cpu-data"
MOUNT="/mnt/llmtrain" # the example's storage.mountPath (the API default)
JOB_DIR="${MOUNT}/runs/${JOB_NS}/${JOB}" # the job's runs: one per uid, <JOB_DIR>/<metadata.uid>
CHECKPOINT_GLOB="checkpoint-step-*" # the trainer's checkpoint directories (llmtrain_trainer.rundir)
EXPORT_DIR="export"

DRY_RUN=0
KEEP_CLUSTER=0
CLUSTER_CREATED=0
WORK_DIR=""

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

python_bin() {
  if [[ -n "${PYTHON:-}" ]]; then
    printf '%s\n' "$PYTHON"
  elif [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    printf '%s\n' ".venv/bin/python"
  else
    printf '%s\n' "python3"
  fi
}

preflight() {
  local missing=()
  local tool
  for tool in docker kind helm kubectl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    if ((DRY_RUN)); then
      printf '# note: not installed here: %s (a real run needs them)\n' "${missing[*]}"
      return 0
    fi
    fail "missing tools: ${missing[*]} (install docker, kind, helm and kubectl)"
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
  if [[ -n "$WORK_DIR" ]]; then
    rm -rf "$WORK_DIR"
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
  log "claim $CLAIM with examples/data/"
  k create namespace "$JOB_NS"
  k label namespace "$JOB_NS" pod-security.kubernetes.io/warn=restricted
  k -n "$JOB_NS" apply -f tests/e2e/manifests/storage.yaml
  k -n "$JOB_NS" wait --for=condition=Ready pod/storage-shell --timeout 300s
  k cp examples/data "${JOB_NS}/storage-shell:${MOUNT}/data" -c shell
  k -n "$JOB_NS" exec storage-shell -c shell -- test -s "${MOUNT}/data/tiny-stories.txt"
}

submit_job() {
  log "job $JOB (examples/tiny-cpu.yaml with storage.claimName: $CLAIM)"
  local python job_file
  python="$(python_bin)"
  if ((DRY_RUN)); then
    job_file="<tmp>/${JOB}.yaml"
  else
    WORK_DIR="$(mktemp -d)"
    job_file="$WORK_DIR/${JOB}.yaml"
  fi
  printf '+ %q tests/e2e/make_job.py --claim %q examples/tiny-cpu.yaml > %q\n' "$python" "$CLAIM" "$job_file"
  if ((!DRY_RUN)); then
    "$python" tests/e2e/make_job.py --claim "$CLAIM" examples/tiny-cpu.yaml >"$job_file"
  fi
  k -n "$JOB_NS" apply -f "$job_file"
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

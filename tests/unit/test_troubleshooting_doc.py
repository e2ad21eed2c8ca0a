"""The README's troubleshooting table quotes llmtrain's own failure messages: each fragment in its
first column must still come out of the code that writes it. Each producer below calls the pure
function behind the message with the inputs that trigger it, so a reworded message (or a row for a
message nobody writes) fails here instead of sending users to search for text that never appears."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import advice, memory
from llmtrain.api.validation import parse_job
from llmtrain.constants import JOB_LABEL, JOB_UID_LABEL, ROLE_LABEL
from llmtrain.operator.children import EarlierPodsRemain
from llmtrain.operator.diagnosis import diagnose
from llmtrain.operator.status import Observed, with_root_cause
from llmtrain_trainer import fabric_check
from llmtrain_trainer.main import root_cause

from tests.unit.test_memory import LLAMA3_8B  # an inline config: activations count before start-up

REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def table_fragments() -> list[str]:
    """The backquoted first cells of the table under the README's Troubleshooting heading."""
    text = (REPO / "README.md").read_text()
    section = text.split("#### Troubleshooting", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|--")]
    fragments = []
    for row in rows[1:]:  # after the header
        quoted = re.match(r"\| `([^`]+)` \|", row)
        assert quoted, f"a row without a quoted message in its first column: {row}"
        fragments.append(quoted.group(1))
    return fragments


def _pod(
    *,
    gpus: int = 8,
    selector: dict[str, str] | None = None,
    waiting: tuple[str, str] | None = None,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    limits = {"cpu": "8", GPU: str(gpus)}
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if waiting:
        status["containerStatuses"] = [
            {"name": "ray-worker", "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}}}
        ]
    if unschedulable is not None:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    return {
        "metadata": {"name": "j-worker-0", "uid": "u1", "labels": {JOB_LABEL: "j", ROLE_LABEL: "worker"}},
        "spec": {
            "containers": [{"name": "ray-worker", "image": "ghcr.io/x/t:1", "resources": {"limits": limits}}],
            "nodeSelector": selector if selector is not None else H100,
            "tolerations": [],
        },
        "status": status,
    }


def _node(
    gpus: int, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "labels": labels if labels is not None else H100},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {GPU: str(gpus)}},
    }


def _diagnosis(
    pods: list[dict[str, Any]], nodes: list[dict[str, Any]], events: list[Any] | None = None
) -> str:
    found = diagnose(pods, events or [], nodes, cluster_name="j-raycluster")
    assert found is not None
    return found.message


def _gpu_never_fits() -> str:
    return _diagnosis(
        [_pod(gpus=8, unschedulable="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")], [_node(4)]
    )


def _gpu_busy() -> str:
    return _diagnosis(
        [_pod(gpus=8, unschedulable="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")], [_node(8)]
    )


def _no_matching_node() -> str:
    return _diagnosis(
        [_pod(unschedulable="0/1 nodes are available: 1 node(s) didn't match")], [_node(8, labels={})]
    )


def _taint() -> str:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    return _diagnosis([_pod(unschedulable="untolerated taint")], [_node(8, taints=[taint])])


def _image_pull() -> str:
    return _diagnosis([_pod(waiting=("ImagePullBackOff", "Back-off pulling image"))], [_node(8)])


def _missing_secret() -> str:
    return _diagnosis(
        [_pod(waiting=("CreateContainerConfigError", 'secret "hf-token" not found'))], [_node(8)]
    )


def _quota() -> str:
    event = {
        "involvedObject": {"kind": "RayCluster", "name": "j-raycluster"},
        "reason": "FailedToCreateWorkerPod",
        "message": 'pods "j-worker-0" is forbidden: exceeded quota: gpus, '
        "requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, "
        "limited: requests.nvidia.com/gpu=8",
    }
    return _diagnosis([], [], [event])


def _secrets_policy() -> str:
    refusal = advice.secrets_refusal("team-a", ["wandb"], {"llmtrain.dev/allowed-secrets": "hf-token"})
    assert refusal is not None
    return refusal


def _earlier_pods() -> str:
    labels = {JOB_LABEL: "j", JOB_UID_LABEL: "old"}
    pod = {
        "metadata": {"name": "j-old-head", "namespace": "team-a", "labels": labels, "deletionTimestamp": "x"}
    }
    return str(EarlierPodsRemain([pod], "new"))


def _admission_policy() -> str:
    """The chart's ValidatingAdmissionPolicy writes this one in CEL (tests/cluster/test_containment.py
    runs it against a real API server); here only its source is checked for the fragment."""
    return (REPO / "charts" / "llmtrain" / "templates" / "admission-policy.yaml").read_text()


def _memory_findings(document: dict[str, Any]) -> str:
    findings = memory.check(memory.Plan.of_job(parse_job(document).spec))
    assert len(findings) == 1
    return findings[0].message


def _example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return document


def _cannot_fit() -> str:
    document = _example("llama3-70b-zero3-lora.yaml")
    document["spec"].update(method={"type": "full"}, strategy={"type": "ddp"})
    document["spec"]["resources"]["workers"] = 1
    return _memory_findings(document)


def _probably_not() -> str:
    document = _example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(gradientCheckpointing=False, microBatchSize=8)
    return _memory_findings(document)


def _fabric() -> str:
    lines = ["host:1:1 [0] NCCL INFO Using network Socket"]
    return fabric_check.decide("infiniband", lines, None, "/tmp/nccl.log").message


class _OutOfMemoryError(RuntimeError):
    """Named as torch names its CUDA OOM (torch.OutOfMemoryError), without importing torch."""


_OutOfMemoryError.__name__ = "OutOfMemoryError"


class _TrainingFailed(Exception):
    """Ray Train's failure with its per-rank errors (`worker_failures`), as root_cause reads it."""

    def __init__(self) -> None:
        super().__init__("training failed")
        self.worker_failures = {3: _OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")}


def _oom() -> str:
    failed = Observed("Failed", "RayJobFailed", "the Ray job failed")
    return with_root_cause(failed, {"error": root_cause(_TrainingFailed())}).message


PRODUCERS: dict[str, Callable[[], str]] = {
    "but the most any of the": _gpu_never_fits,
    "not that many are free now": _gpu_busy,
    "no node has the labels its nodeSelector asks for": _no_matching_node,
    "have taints it does not tolerate": _taint,
    "cannot be pulled": _image_pull,
    "(referenced by an env variable) does not exist": _missing_secret,
    "the namespace's ResourceQuota refuses the Ray cluster's pods": _quota,
    "does not list in its annotation llmtrain.dev/allowed-secrets": _secrets_policy,
    "llmtrain containment: refused to write": _admission_policy,
    "of an earlier LLMTrainingJob of this name": _earlier_pods,
    "cannot fit: parameters, gradients and optimizer states alone need": _cannot_fit,
    "probably does not fit: estimated peak": _probably_not,
    "NCCL fell back to TCP sockets instead of": _fabric,
    "trainer reported: OutOfMemoryError on rank": _oom,
}


def test_every_row_of_the_table_has_a_producer() -> None:
    assert table_fragments() == list(PRODUCERS)


@pytest.mark.parametrize("fragment", list(PRODUCERS))
def test_the_code_still_writes_the_quoted_fragment(fragment: str) -> None:
    message = PRODUCERS[fragment]()
    assert fragment in message, message

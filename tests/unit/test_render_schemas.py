"""Every rendered RayJob validates against the CRD schema of the KubeRay Go module the cluster tier
runs; core objects against Kubernetes' own schemas. Examples plus a hypothesis-generated family."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmtrain.api.validation import parse_job
from llmtrain.quantity import cpu_cores, parse_quantity
from llmtrain.render import render

from tests.support.jobs import EXAMPLES, minimal_job
from tests.support.kuberay import rayjob_schema
from tests.support.schema import validate_strict

K8S_VERSION = "1.33"


def check_objects(objs: list[dict[str, Any]]) -> None:
    schema = rayjob_schema()
    for obj in objs:
        if obj["kind"] == "RayJob":
            validate_strict(obj, schema)
            cluster = obj["spec"]["rayClusterSpec"]
            templates = [cluster["headGroupSpec"]["template"], obj["spec"]["submitterPodTemplate"]]
            templates += [g["template"] for g in cluster["workerGroupSpecs"]]
            for template in templates:
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **template}
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_render_valid_objects(example: Any) -> None:
    import yaml

    job = parse_job(yaml.safe_load(example.read_text()))
    check_objects(render(job))


names = st.from_regex(r"[a-z]([-a-z0-9]{0,45}[a-z0-9])?", fullmatch=True).filter(
    lambda s: "--" not in s or True
)
quantities = st.sampled_from(["1", "500m", "2", "16", "96", "1.5"])
memories = st.sampled_from(["512Mi", "8Gi", "64Gi", "1000Gi", "1Ti"])


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.integers(0, 8))
    strategy_type = draw(st.sampled_from(["fsdp", "deepspeed", "ddp"]))
    strategy: dict[str, Any] = {"type": strategy_type}
    if strategy_type == "deepspeed" and draw(st.booleans()):
        stage = draw(st.sampled_from([1, 2, 3]))
        strategy["deepspeed"] = {
            "zeroStage": stage,
            "offloadOptimizer": gpus > 0 and draw(st.booleans()),
            "offloadParams": stage == 3 and draw(st.booleans()),
        }
    if strategy_type == "fsdp" and draw(st.booleans()):
        strategy["fsdp"] = {"reshardAfterForward": draw(st.booleans()), "cpuOffload": draw(st.booleans())}
    method: dict[str, Any] = {"type": draw(st.sampled_from(["full", "lora"]))}
    if method["type"] == "lora" and draw(st.booleans()):
        method["lora"] = {"rank": draw(st.integers(1, 256)), "alpha": draw(st.integers(1, 512))}
    storage: dict[str, Any] = (
        {"claimName": "shared"}
        if draw(st.booleans())
        else {
            "create": {
                "size": draw(memories),
                # The head and every worker mount it: ReadWriteMany is required (a CEL rule).
                "accessModes": draw(st.sampled_from([["ReadWriteMany"], ["ReadWriteMany", "ReadWriteOnce"]])),
            }
        }
    )
    storage["mountPath"] = draw(st.sampled_from(["/mnt/llmtrain", "/data", "/mnt/shared/x"]))
    memory = draw(memories)
    # /dev/shm counts against the worker's memory: never larger than it (a model validator).
    fitting = [m for m in ("256Mi", "8Gi", "64Gi") if parse_quantity(m) <= parse_quantity(memory)]
    resources: dict[str, Any] = {
        "workers": draw(st.integers(1, 64)),
        "gpusPerWorker": gpus,
        # At least half a core per GPU process (the spec refuses less: Ray could not place them).
        "cpu": draw(quantities.filter(lambda q: cpu_cores(q) >= 0.5 * gpus)),
        "memory": memory,
        "sharedMemory": draw(st.sampled_from(fitting)),
    }
    if draw(st.booleans()):
        resources["acceleratorType"] = "NVIDIA-A100-SXM4-80GB"
    if draw(st.booleans()):
        resources["tolerations"] = [
            {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        ]
    run_policy: dict[str, Any] = {"maxRetries": draw(st.integers(0, 10)), "suspend": draw(st.booleans())}
    if draw(st.booleans()):
        run_policy["activeDeadlineSeconds"] = draw(st.integers(1, 10**6))
    if draw(st.booleans()):
        run_policy["queueName"] = "team-queue"
    precision = draw(st.sampled_from(["bf16", "fp32"] + (["fp16"] if gpus else [])))
    # The fabric profiles need GPUs; their device settings are optional.
    profiles = ["auto", "nvlink", "ethernet"] + (["infiniband", "efa"] if gpus else [])
    network: dict[str, Any] = {"ncclProfile": draw(st.sampled_from(profiles))}
    if network["ncclProfile"] in ("infiniband", "efa") and draw(st.booleans()):
        network["fabric"] = {"perWorker": draw(st.integers(1, 32)), "ipcLock": draw(st.booleans())}
    doc = minimal_job(
        draw(names),
        namespace=draw(st.sampled_from(["default", "ml-team"])),
        strategy=strategy,
        method=method,
        storage=storage,
        resources=resources,
        runPolicy=run_policy,
        training={"precision": precision},
        network=network,
    )
    if draw(st.booleans()):
        doc["metadata"]["uid"] = "0b7c6a8e-uid"
    return doc


@pytest.mark.thorough
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_generated_specs_render_valid_objects(doc: dict[str, Any]) -> None:
    check_objects(render(parse_job(doc)))


def test_a_misspelled_field_would_be_caught() -> None:
    """Guard for the guard: strict validation does reject an unknown RayJob field."""
    import jsonschema

    obj = render(parse_job(minimal_job()))[-1]
    obj["spec"]["shutdownAfterJobFinish"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate_strict(obj, rayjob_schema())

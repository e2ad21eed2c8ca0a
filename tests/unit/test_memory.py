"""The memory estimate behind `llmtrain validate` and the trainer's preflight (no accelerator)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import cli, memory
from llmtrain.api.spec import LLMTrainingJobSpec, ResourcesSpec
from llmtrain.api.validation import parse_job

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
# Meta-Llama-3-8B's and -70B's config.json (the sizes that matter).
LLAMA3_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
LLAMA3_70B = {
    **LLAMA3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return document


def plan_of(document: dict[str, Any]) -> memory.Plan:
    return memory.Plan.of_job(parse_job(document).spec)


def seventy_b_full_ddp() -> dict[str, Any]:
    """The issue's case: a 70B full fine-tune with DDP on one worker of 8 x 80 GB."""
    document = example("llama3-70b-zero3-lora.yaml")
    document["spec"]["method"] = {"type": "full"}
    document["spec"]["strategy"] = {"type": "ddp"}
    document["spec"]["resources"]["workers"] = 1
    return document


def test_published_parameter_counts_follow_from_the_config() -> None:
    """Meta publishes 8.03B and 70.55B for Llama 3; the count is exact arithmetic, not a guess."""
    assert memory.Shape.from_config(LLAMA3_8B) is not None
    assert memory.Shape.from_config(LLAMA3_8B).parameters() == 8_030_261_248  # type: ignore[union-attr]
    assert memory.Shape.from_config(LLAMA3_70B).parameters() == 70_553_706_496  # type: ignore[union-attr]
    assert memory.Shape.from_config({"model_type": "llama", "hidden_size": 64}) is None


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("meta-llama/Meta-Llama-3-70B", 70 * 10**9),
        ("meta-llama/Llama-3.1-8B-Instruct", 8 * 10**9),
        ("Qwen/Qwen2.5-0.5B", 5 * 10**8),
        ("mistralai/Mixtral-8x7B-v0.1", 56 * 10**9),
        ("HuggingFaceTB/SmolLM2-135M", 135 * 10**6),
        ("gpt2", None),
        ("/mnt/shared/models/my-model", None),
    ],
)
def test_a_hub_model_is_sized_by_its_name(name: str, parameters: int | None) -> None:
    assert memory.parameters_from_name(name) == parameters


@pytest.mark.parametrize(
    ("resources", "gib"),
    [
        ({"gpusPerWorker": 8, "acceleratorType": "NVIDIA-H100-80GB-HBM3"}, 80),
        ({"gpusPerWorker": 8, "acceleratorType": "NVIDIA-A100-SXM4-40GB"}, 40),
        ({"gpusPerWorker": 8, "acceleratorType": "NVIDIA-H200"}, 141),
        ({"gpusPerWorker": 1, "acceleratorType": "NVIDIA-L4"}, 24),
        ({"gpusPerWorker": 1, "gpuResourceName": "nvidia.com/mig-1g.10gb"}, 10),
        ({"gpusPerWorker": 0, "memory": "6Gi", "sharedMemory": "1Gi"}, 6),
        ({"gpusPerWorker": 8}, None),
        ({"gpusPerWorker": 8, "acceleratorType": "some-accelerator"}, None),
    ],
)
def test_device_memory_comes_from_the_accelerator_label(resources: dict[str, Any], gib: int | None) -> None:
    spec = ResourcesSpec.model_validate(resources, by_alias=True)
    assert memory.device_memory_bytes(spec) == (gib * GIB if gib else None)


def test_states_follow_the_strategy_that_holds_them() -> None:
    """16 bytes per trained parameter (fp32 weights, gradients, two moments), sharded per strategy."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    n, devices = 8_030_261_248, 8
    fsdp = memory.estimate(plan_of(document))
    assert fsdp is not None and (fsdp.params, fsdp.grads, fsdp.optimizer) == (
        4 * n // devices,
        4 * n // devices,
        8 * n // devices,
    )
    document["spec"]["resources"]["workers"] = 2
    document["spec"]["strategy"] = {"type": "fsdp", "fsdp": {"hybridShardSize": 8}}
    hsdp = memory.estimate(plan_of(document))  # 16 GPUs, but each shard group holds it all
    assert hsdp is not None and hsdp.states == fsdp.states
    document["spec"]["resources"]["workers"] = 1
    document["spec"]["strategy"] = {"type": "ddp"}
    ddp = memory.estimate(plan_of(document))
    # DDP: 16 bytes, and the reducer's fp32 buckets, a second copy of the gradients.
    assert ddp is not None and ddp.states == 20 * n and ddp.grad_buffers == 4 * n and ddp.working_set == 0
    document["spec"]["strategy"] = {"type": "deepspeed", "deepspeed": {"zeroStage": 2}}
    zero2 = memory.estimate(plan_of(document))
    # bf16 weights whole; fp32 gradients (accumulated in fp32), the fp32 master and moments sharded.
    assert zero2 is not None and (zero2.params, zero2.grads, zero2.grad_buffers, zero2.optimizer) == (
        2 * n,
        4 * n // 8,
        0,
        12 * n // 8,
    )
    document["spec"]["strategy"] = {"type": "deepspeed", "deepspeed": {"zeroStage": 1}}
    zero1 = memory.estimate(plan_of(document))
    # BF16_Optimizer: an unsharded fp32 copy of every gradient, each bf16 one freed at once.
    assert zero1 is not None and (zero1.params, zero1.grads, zero1.grad_buffers, zero1.optimizer) == (
        2 * n,
        0,
        4 * n,
        12 * n // 8,
    )
    document["spec"]["method"] = {"type": "lora", "lora": {"rank": 16, "targetModules": ["q_proj", "v_proj"]}}
    lora = memory.estimate(plan_of(document))
    # r x (in + out) per targeted projection per block: q 4096->4096, v 4096->1024.
    trained = 32 * 16 * ((4096 + 4096) + (4096 + 1024))
    assert lora is not None and lora.trainable_parameters == trained
    assert lora.optimizer == 12 * trained // 8


def test_the_shipped_examples_fit() -> None:
    for name in ("llama3-8b-fsdp.yaml", "llama3-70b-zero3-lora.yaml", "tiny-cpu.yaml", "tiny-cpu-hf.yaml"):
        assert memory.check(plan_of(example(name))) == [], name


def test_70b_full_with_ddp_cannot_fit_and_says_what_would() -> None:
    findings = memory.check(plan_of(seventy_b_full_ddp()))
    assert len(findings) == 1 and findings[0].error
    message = findings[0].message
    # 20 bytes a parameter: fp32 weights, gradients, the reducer's gradient buckets, two moments.
    assert message.startswith("cannot fit: parameters, gradients and optimizer states alone need 1303.9 GiB")
    assert (
        "per GPU of 80.0 GiB" in message
        and "from the size in the name 'meta-llama/Meta-Llama-3-70B'" in message
    )
    assert (
        "8 device(s); activations not counted until the model's config.json is read at start-up). " in message
    )
    assert "To fit: use strategy.type: fsdp and train LoRA adapters (method.type: lora)" in message


def test_a_fix_it_names_does_fit() -> None:
    """The suggested worker count is the smallest that fits: one fewer does not."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_70B, "tokenizer": "byte-level"}
    findings = memory.check(plan_of(document))
    assert len(findings) == 1 and findings[0].error, findings
    assert "raise resources.workers to 2" in findings[0].message
    for workers, fits in ((1, False), (2, True)):
        changed = copy.deepcopy(document)
        changed["spec"]["resources"]["workers"] = workers
        assert (memory.check(plan_of(changed)) == []) is fits, workers


def test_activations_that_do_not_fit_are_a_warning_naming_checkpointing() -> None:
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(gradientCheckpointing=False, microBatchSize=8)
    findings = memory.check(plan_of(document))
    assert len(findings) == 1 and findings[0].error is False
    assert findings[0].message.startswith("probably does not fit: estimated peak")
    assert "set training.gradientCheckpointing: true" in findings[0].message


def test_validate_fails_on_a_spec_that_cannot_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(seventy_b_full_ddp()))
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: llama3-70b-zero3-lora: memory error: cannot fit" in err


def test_validate_warns_but_passes_on_a_spec_that_probably_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(gradientCheckpointing=False, microBatchSize=8)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    assert cli.main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "memory warning: probably does not fit" in err and "1 file(s) valid" in out


def test_the_rendered_trainer_config_carries_the_device_memory() -> None:
    from llmtrain.render.trainer_config import cluster_trainer_config

    job = parse_job(
        {**example("llama3-8b-fsdp.yaml"), "metadata": {"name": "j", "namespace": "n", "uid": "u"}}
    )
    scaling = cluster_trainer_config(job).scaling
    assert (scaling.num_workers, scaling.devices_per_worker, scaling.device_memory_bytes) == (8, 8, 80 * GIB)
    plan = memory.Plan.of_trainer(cluster_trainer_config(job))
    assert plan == memory.Plan.of_job(job.spec)


def test_plan_of_a_spec_is_total_over_resources() -> None:
    spec = LLMTrainingJobSpec.model_validate(example("tiny-cpu.yaml")["spec"], by_alias=True)
    plan = memory.Plan.of_job(spec)
    assert plan.devices == spec.resources.workers and not plan.on_gpu


def test_a_plan_counts_the_specs_training_processes() -> None:
    """Plan.devices is ResourcesSpec.processes, from the spec or from the rendered config alike."""
    from llmtrain.render.trainer_config import cluster_trainer_config

    for workers, gpus in ((3, 4), (5, 0)):
        doc = example("llama3-8b-fsdp.yaml")
        doc["spec"]["resources"].update(workers=workers, gpusPerWorker=gpus)
        if gpus == 0:
            doc["spec"]["training"].pop("precision", None)
            doc["spec"]["strategy"] = {"type": "ddp"}
        job = parse_job({**doc, "metadata": {"name": "j", "namespace": "n", "uid": "u"}})
        plan = memory.Plan.of_job(job.spec)
        assert (plan.devices, plan.workers) == (job.spec.resources.processes, workers)
        assert memory.Plan.of_trainer(cluster_trainer_config(job)) == plan
        assert plan.with_workers(7).devices == 7 * job.spec.resources.processes_per_worker


@pytest.mark.parametrize(
    ("precision", "gpus", "compute_bytes"),
    [("bf16", 8, 2), ("fp16", 8, 2), ("fp32", 8, 4), ("bf16", 0, 4), ("fp32", 0, 4)],
)
def test_compute_dtype_follows_precision_and_device(precision: str, gpus: int, compute_bytes: int) -> None:
    """fp32 holds 4 bytes per value, bf16/fp16 on GPUs 2, and CPUs compute in fp32 whatever is asked:
    counting fp32 at 2 bytes would halve the lower bound that refuses a plan that cannot fit."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"]["precision"] = precision
    document["spec"]["resources"]["gpusPerWorker"] = gpus
    if gpus == 0:
        document["spec"]["resources"].pop("acceleratorType", None)
    n = 8_030_261_248
    devices = max(gpus, 1)
    document["spec"]["strategy"] = {"type": "deepspeed", "deepspeed": {"zeroStage": 1}}
    zero1 = memory.estimate(plan_of(document))
    # ZeRO keeps weights in the compute dtype; only the fp32 master and moments shard. Under bf16
    # the gradients accumulate in an unsharded fp32 buffer (BF16_Optimizer), else in the weights' dtype.
    assert zero1 is not None
    if compute_bytes == 2 and precision == "bf16":
        assert (zero1.params, zero1.grads, zero1.grad_buffers) == (2 * n, 0, 4 * n)
    else:
        assert (zero1.params, zero1.grads, zero1.grad_buffers) == (compute_bytes * n, compute_bytes * n, 0)
    assert zero1.optimizer == 12 * n // devices
    document["spec"]["strategy"] = {"type": "fsdp"}
    fsdp = memory.estimate(plan_of(document))
    # FSDP2 keeps fp32 states whatever the precision and gathers blocks in the compute dtype.
    assert fsdp is not None and fsdp.states == 16 * n // devices
    block = memory.Shape.from_config(LLAMA3_8B)
    assert block is not None and fsdp.working_set == 2 * compute_bytes * block.block_parameters()


def test_the_builtin_loop_counts_one_chunk_of_logits_and_other_trainers_all_of_them() -> None:
    """The builtin loop takes the loss a chunk of positions at a time (trainer loss.py); a
    transformers.Trainer holds a micro-batch's whole logits, their fp32 copy and its gradient."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(microBatchSize=4, precision="bf16")
    document["spec"]["dataset"]["maxSeqLength"] = 2048
    builtin = memory.estimate(plan_of(document))
    document["spec"]["trainer"] = {"type": "huggingface"}
    whole = memory.estimate(plan_of(document))
    assert builtin is not None and whole is not None and builtin.activations and whole.activations
    per_position = 128_256 * (2 + 8)  # bf16 logits, fp32 copy, fp32 gradient
    assert memory.LOSS_CHUNK_TOKENS < 4 * 2048
    assert whole.activations - builtin.activations == (4 * 2048 - memory.LOSS_CHUNK_TOKENS) * per_position


def test_selective_checkpointing_is_estimated_between_none_and_full() -> None:
    """checkpointEveryBlocks: 2 keeps every other block's activations: the saved activations grow
    by exactly those of half the blocks."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    training = document["spec"]["training"]
    training.update(gradientCheckpointing=False, microBatchSize=2)
    none = memory.estimate(plan_of(document))
    training.update(gradientCheckpointing=True)
    full = memory.estimate(plan_of(document))
    training.update(checkpointEveryBlocks=2)
    every_other = memory.estimate(plan_of(document))
    assert none and full and every_other and none.activations and full.activations and every_other.activations
    assert full.activations < every_other.activations < none.activations
    shape = memory.Shape.from_config(LLAMA3_8B)
    assert shape is not None and shape.num_layers == 32
    tokens, d = 2 * document["spec"]["dataset"]["maxSeqLength"], shape.hidden_size
    # none: 32 blocks' activations; full: 32 block inputs (bf16) and one block being recomputed.
    per_block = (none.activations - full.activations + 32 * tokens * 2 * d) // 31
    assert every_other.activations - full.activations == 16 * (per_block - tokens * 2 * d)


def _fixes_for(document: dict[str, Any]) -> str:
    (finding,) = memory.check(plan_of(document))
    return finding.message.split(". To fit: ", 1)[1]


def test_each_fix_is_named_as_the_spec_spells_it() -> None:
    """The advice is what a user types into the spec, so it is pinned word for word."""
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(gradientCheckpointing=False, microBatchSize=8)
    micro_batch = "lower training.microBatchSize to 1 (raise gradientAccumulationSteps to keep the batch)."
    assert _fixes_for(document) == f"set training.gradientCheckpointing: true; or {micro_batch}"
    # A micro-batch of 2 that only fits as 1 (long sequences, checkpointing already on).
    document["spec"]["training"].update(gradientCheckpointing=True, microBatchSize=2)
    document["spec"]["dataset"]["maxSeqLength"] = 131072
    assert _fixes_for(document) == micro_batch


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_below_zero3_is_told_to_shard_the_parameters(stage: int) -> None:
    document = example("llama3-70b-zero3-lora.yaml")
    document["spec"]["model"] = {"config": LLAMA3_70B, "tokenizer": "byte-level"}
    document["spec"]["strategy"]["deepspeed"]["zeroStage"] = stage
    assert _fixes_for(document) == "set strategy.deepspeed.zeroStage: 3."


def test_changes_that_fit_only_together_and_with_more_workers_are_named_together() -> None:
    document = seventy_b_full_ddp()
    lora = "train LoRA adapters (method.type: lora)"
    assert _fixes_for(document) == f"use strategy.type: fsdp and {lora}."
    document["spec"]["model"]["name"] = "meta-llama/Llama-3.1-405B"
    # The frozen 405B base at 2 bytes a parameter (bf16, no fp32 master): two workers, not three.
    assert _fixes_for(document) == f"use strategy.type: fsdp and {lora} and raise resources.workers to 2."


def test_a_plan_nothing_fixes_says_so() -> None:
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["model"] = {"config": LLAMA3_8B, "tokenizer": "byte-level"}
    document["spec"]["training"].update(gradientCheckpointing=True, microBatchSize=2)
    document["spec"]["dataset"]["maxSeqLength"] = 262144
    (finding,) = memory.check(plan_of(document))
    assert finding.message == (
        "probably does not fit: estimated peak 201.8 GiB per GPU of 80.0 GiB (parameters 3.7 GiB, "
        "gradients 3.7 GiB, optimizer 7.5 GiB, gathered 832.0 MiB, activations+logits 187.7 GiB, which "
        "the gradients replace in backward (the larger counts), runtime 2.0 GiB; 8.03B parameters from "
        "the model config, 8.03B trained, 8 device(s)). "
        "No change of strategy, method or worker count fits: use accelerators with more memory."
    )


@pytest.mark.parametrize(
    ("n", "count", "size"),
    [
        (1_005_001, "1.01M", "1001.5 KiB"),
        (125_000_000, "125.00M", "119.2 MiB"),
        (2**30, "1.07B", "1.0 GiB"),
        (10**9, "1.00B", "953.7 MiB"),
        (1_005_000_001, "1.01B", "958.4 MiB"),
    ],
)
def test_counts_and_sizes_read_as_people_write_them(n: int, count: str, size: str) -> None:
    assert memory.human_count(n) == count
    if size.endswith("KiB"):  # below a MiB it is still written in MiB
        size = f"{n / 2**20:.1f} MiB"
    assert memory.human_bytes(n) == size


def test_the_organisation_in_a_hub_name_says_nothing_of_the_size() -> None:
    assert memory.parameters_from_name("org-70B/tiny-model") is None
    assert memory.parameters_from_name("/models/org-70B/tiny-model") is None
    assert memory.parameters_from_name("org-70B/Llama-3-8B") == 8 * 10**9


def test_a_plan_that_needs_exactly_the_devices_memory_fits() -> None:
    plan = plan_of(example("llama3-8b-fsdp.yaml"))

    @dataclass(frozen=True)
    class Exactly(memory.Model):
        states: int = 0
        peak: int | None = None

        def estimate(self, plan: memory.Plan) -> memory.Estimate | None:
            if self.states == 0:
                return None
            activations = None if self.peak is None else self.peak - self.states
            return memory.Estimate(self.states, 0, 0, 0, activations, 0, 1, 1, 1, "test")

    assert memory._fits(plan, Exactly(None, None, states=GIB), GIB)
    assert memory._fits(plan, Exactly(None, None, states=GIB // 2, peak=GIB), GIB)
    assert not memory._fits(plan, Exactly(None, None, states=GIB, peak=GIB + 1), GIB)
    assert not memory._fits(plan, Exactly(None, None), GIB)  # no estimate: nothing is known to fit


def test_a_cpu_plan_is_measured_against_its_workers_memory() -> None:
    document = seventy_b_full_ddp()
    document["spec"]["resources"].update(gpusPerWorker=0, memory="256Gi")
    document["spec"].pop("network", None)  # the example's InfiniBand profile needs GPUs
    (finding,) = memory.check(plan_of(document))
    assert "per worker (resources.memory) of 256.0 GiB" in finding.message


def test_check_reads_the_config_it_is_given_over_the_specs() -> None:
    """The trainer's preflight passes the config.json it read; the spec named only the model."""
    plan = plan_of(example("llama3-8b-fsdp.yaml"))
    assert memory.check(plan) == []
    (finding,) = memory.check(plan, LLAMA3_70B)
    assert "70.55B parameters from the model config" in finding.message


def test_a_plan_at_exactly_the_devices_memory_draws_no_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_of(example("llama3-8b-fsdp.yaml"))
    capacity = plan.capacity
    assert capacity is not None
    for states, peak in ((capacity, capacity), (capacity // 2, capacity)):
        exact = memory.Estimate(states, 0, 0, 0, peak - states, 0, 1, 1, 1, "test")
        monkeypatch.setattr(memory, "estimate", lambda *args, e=exact: e)
        assert memory.check(plan) == []


def test_one_gpu_per_worker_is_a_gpu_plan() -> None:
    document = example("llama3-8b-fsdp.yaml")
    document["spec"]["resources"]["gpusPerWorker"] = 1
    assert plan_of(document).on_gpu


def _seventy_b_lora_zero(stage: int, gpus: int) -> dict[str, Any]:
    document = example("llama3-70b-zero3-lora.yaml")
    document["spec"]["model"] = {"config": LLAMA3_70B, "tokenizer": "byte-level"}
    document["spec"]["resources"].update(workers=1, gpusPerWorker=gpus)
    document["spec"]["strategy"]["deepspeed"]["zeroStage"] = stage
    return document


def test_zero3_is_advised_as_deepspeed_and_never_to_a_zero3_plan() -> None:
    """On 4 GPUs ZeRO-3 fits where FSDP (which keeps fp32 parameters) would not; a plan already at
    ZeRO-3 is never told to set it."""
    assert _fixes_for(_seventy_b_lora_zero(1, 4)) == "set strategy.deepspeed.zeroStage: 3."
    assert "zeroStage" not in _fixes_for(_seventy_b_lora_zero(3, 2))


def test_the_zero3_change_keeps_the_users_offload_and_skips_a_zero3_plan() -> None:
    document = _seventy_b_lora_zero(1, 8)
    document["spec"]["strategy"]["deepspeed"]["offloadOptimizer"] = True
    changes = dict(memory._changes(plan_of(document)))
    zero3 = changes["set strategy.deepspeed.zeroStage: 3"](plan_of(document)).strategy
    assert zero3.type == "deepspeed" and zero3.deepspeed is not None
    assert (zero3.deepspeed.zero_stage, zero3.deepspeed.offload_optimizer) == (3, True)
    already = dict(memory._changes(plan_of(_seventy_b_lora_zero(3, 8))))
    assert "set strategy.deepspeed.zeroStage: 3" not in already

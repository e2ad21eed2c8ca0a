"""The memory estimate's arithmetic, term by term, on a small model with an odd parameter count.

test_memory.py checks the estimate against published models and the advice it gives; here every
term is written out as the module docstring states it, on 8 devices and 215,019 parameters, so
that no sharded state divides evenly: a `/` where `//` belongs, a dropped offload or a wrong dtype
changes an exact integer."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import memory
from llmtrain.api.spec import LoraSpec, ResourcesSpec
from llmtrain.api.validation import parse_job

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
SMALL = {
    "model_type": "llama",
    "vocab_size": 1001,
    "hidden_size": 63,
    "intermediate_size": 100,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
}
SHAPE = memory.Shape.from_config(SMALL)
assert SHAPE is not None
P = SHAPE.parameters()
BLOCK = SHAPE.block_parameters()
DEVICES = 8
SEQ, MICRO = 64, 2
TOKENS = SEQ * MICRO


def _document(strategy: dict[str, Any], **training: Any) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / "llama3-8b-fsdp.yaml").read_text())
    spec = document["spec"]
    spec["model"] = {"config": copy.deepcopy(SMALL), "tokenizer": "byte-level"}
    spec["strategy"] = strategy
    spec["dataset"]["maxSeqLength"] = SEQ
    spec["training"].update(
        {"microBatchSize": MICRO, "gradientCheckpointing": False, "compile": False, **training}
    )
    return document


def _plan(strategy: dict[str, Any], **training: Any) -> memory.Plan:
    return memory.Plan.of_job(parse_job(_document(strategy, **training)).spec)


def _estimate(strategy: dict[str, Any], **training: Any) -> memory.Estimate:
    est = memory.estimate(_plan(strategy, **training))
    assert est is not None
    return est


def test_the_small_models_sizes_are_integers_and_its_count_odd() -> None:
    assert P == 215_019 and P % 2 == 1
    shape = memory.Shape.from_config(SMALL)  # here, not at import: mutation testing swaps the code in tests
    assert shape is not None and all(isinstance(size, int) for size in vars(shape).values())
    assert shape.head_dim == 21  # hidden_size // num_attention_heads without a head_dim key


def test_a_config_without_the_optional_keys_has_no_biases_and_untied_embeddings() -> None:
    assert not SHAPE.tied_embeddings and not SHAPE.mlp_bias
    tied = memory.Shape.from_config({**SMALL, "tie_word_embeddings": True, "mlp_bias": True})
    assert tied is not None and tied.tied_embeddings and tied.mlp_bias
    assert tied.parameters() == P - 1001 * 63 + 3 * (100 + 100 + 63)


def test_qkv_biases_add_the_three_output_widths_to_a_block() -> None:
    biased = memory.Shape.from_config({**SMALL, "model_type": "qwen2"})
    assert biased is not None and biased.qkv_bias and not biased.output_bias
    assert biased.block_parameters() == BLOCK + 63 + 21 + 21


@pytest.mark.parametrize(
    ("offload", "params", "optimizer"),
    [
        ({}, 2 * P // DEVICES, 12 * P // DEVICES),
        ({"offloadParams": True}, 0, 12 * P // DEVICES),
        ({"offloadOptimizer": True}, 2 * P // DEVICES, 0),
        ({"offloadParams": True, "offloadOptimizer": True}, 0, 0),
    ],
)
def test_zero3_shards_or_offloads_each_state(offload: dict[str, bool], params: int, optimizer: int) -> None:
    """bf16 on GPUs: bf16 weights, fp32 gradient partitions, 12 bytes of master and moments."""
    est = _estimate({"type": "deepspeed", "deepspeed": {"zeroStage": 3, **offload}})
    assert (est.params, est.grads, est.grad_buffers, est.optimizer) == (
        params,
        4 * P // DEVICES,
        0,
        optimizer,
    )
    assert est.working_set == 2 * 2 * BLOCK


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_below_3_keeps_whole_parameters(stage: int) -> None:
    est = _estimate({"type": "deepspeed", "deepspeed": {"zeroStage": stage, "offloadOptimizer": True}})
    grads = (0, 4 * P) if stage == 1 else (4 * P // DEVICES, 0)
    assert (est.params, (est.grads, est.grad_buffers), est.optimizer, est.working_set) == (2 * P, grads, 0, 0)


@pytest.mark.parametrize(
    ("fsdp", "states"),
    [
        ({}, (4 * P // DEVICES, 4 * P // DEVICES, 8 * P // DEVICES)),
        ({"cpuOffload": True}, (0, 0, 0)),
        ({"hybridShardSize": 4}, (4 * P // 4, 4 * P // 4, 8 * P // 4)),
    ],
)
def test_fsdp_shards_fp32_states_over_its_group_or_offloads_them(
    fsdp: dict[str, Any], states: tuple[int, int, int]
) -> None:
    est = _estimate({"type": "fsdp", "fsdp": fsdp})
    assert (est.params, est.grads, est.optimizer) == states
    assert (est.grad_buffers, est.working_set) == (0, 2 * 2 * BLOCK)


def test_fsdp_on_two_workers_shards_over_all_16_devices() -> None:
    """8 x P bytes of moments divide by 8 devices whatever P is; by 16 only when P is even."""
    plan = _plan({"type": "fsdp"})
    est = memory.estimate(plan.with_workers(2))
    assert est is not None and est.devices == 16
    assert (est.params, est.grads, est.optimizer) == (4 * P // 16, 4 * P // 16, 8 * P // 16)


def test_without_a_shape_nothing_is_gathered_and_lora_adapters_are_left_out() -> None:
    """A hub model known only by its name: the states are a lower bound, nothing more."""
    for strategy in ({"type": "fsdp"}, {"type": "deepspeed", "deepspeed": {"zeroStage": 3}}):
        document = _document(strategy)
        document["spec"]["model"] = {"name": "org/Model-1B"}
        document["spec"]["method"] = {"type": "lora", "lora": {"rank": 8}}
        est = memory.estimate(memory.Plan.of_job(parse_job(document).spec))
        assert est is not None
        assert (est.working_set, est.activations, est.trainable_parameters) == (0, None, 0)
        assert est.total_parameters == 10**9


def test_a_model_with_neither_name_nor_config_is_not_estimated() -> None:
    plan = _plan({"type": "fsdp"})
    plan = replace(plan, model=plan.model.model_copy(update={"config": None, "name": None}))
    assert memory.estimate(plan) is None


def test_a_full_method_trains_every_parameter_even_with_a_lora_section() -> None:
    plan = _plan({"type": "fsdp"})
    plan = replace(plan, method=plan.method.model_copy(update={"lora": LoraSpec()}))
    est = memory.estimate(plan)
    assert est is not None and est.trainable_parameters == P


def _per_block(residual: int, compute: int) -> int:
    kv = SHAPE.num_kv_heads * SHAPE.head_dim
    return TOKENS * (residual * 8 * SHAPE.hidden_size + compute * (2 * kv + 4 * SHAPE.intermediate_size))


def _logits(compute: int) -> int:
    return min(TOKENS, memory.LOSS_CHUNK_TOKENS) * SHAPE.vocab_size * (compute + 8)


@pytest.mark.parametrize(
    ("strategy", "precision", "residual", "compute", "weight_copies"),
    [
        ("fsdp", "bf16", 2, 2, 0),
        ("fsdp", "fp32", 4, 4, 0),
        # DDP under autocast: fp32 residual stream and a bf16 copy of every weight.
        ("ddp", "bf16", 4, 2, 2 * P),
        ("ddp", "fp32", 4, 4, 0),
    ],
)
def test_activations_term_by_term(
    strategy: str, precision: str, residual: int, compute: int, weight_copies: int
) -> None:
    est = _estimate({"type": strategy}, precision=precision)
    assert est.activations == 3 * _per_block(residual, compute) + weight_copies + _logits(compute)


def test_checkpointing_every_second_of_three_blocks_recomputes_two() -> None:
    """Blocks 0 and 2 keep their input only, block 1 everything, and one block is recomputed."""
    est = _estimate({"type": "fsdp"}, gradientCheckpointing=True, checkpointEveryBlocks=2)
    kept_inputs = 2 * TOKENS * 2 * SHAPE.hidden_size
    assert est.activations == kept_inputs + 2 * _per_block(2, 2) + _logits(2)


@pytest.mark.parametrize(
    ("on_gpu", "compile_", "strategy", "compiles"),
    [
        (True, None, "fsdp", True),
        (True, None, "ddp", True),
        (True, None, "deepspeed", False),
        (True, False, "fsdp", False),
        (False, None, "fsdp", False),
        (False, True, "ddp", True),
    ],
)
def test_the_blocks_compile_on_gpus_by_default_and_as_asked(
    on_gpu: bool, compile_: bool | None, strategy: str, compiles: bool
) -> None:
    plan = _plan({"type": strategy})
    training = plan.training.model_copy(update={"compile": compile_})
    assert memory.compiles(replace(plan, training=training, on_gpu=on_gpu)) is compiles


@pytest.mark.parametrize(
    ("resources", "gib"),
    [
        # The table wins over the size in the label: 480 GB counts the Grace CPU's memory.
        ({"acceleratorType": "NVIDIA-GH200-480GB"}, 96),
        # Only the table knows GKE's A100 label.
        (
            {
                "acceleratorType": "nvidia-tesla-a100",
                "acceleratorLabelKey": "cloud.google.com/gke-accelerator",
            },
            40,
        ),
        # Not in the table: the size in the label.
        ({"acceleratorType": "NVIDIA-H100-SXM5-94GB"}, 94),
        # Neither: the product name, in any case.
        ({"acceleratorType": "NVIDIA-L40S-PCIe"}, 48),
        ({"acceleratorType": "nvidia-l40s-pcie"}, 48),
    ],
)
def test_device_memory_from_the_table_then_the_label_then_the_product(
    resources: dict[str, Any], gib: int
) -> None:
    spec = ResourcesSpec.model_validate({"gpusPerWorker": 8, **resources}, by_alias=True)
    assert memory.device_memory_bytes(spec) == gib * GIB


def _brute_force_workers(plan: memory.Plan, model: memory.Model, capacity: int) -> int | None:
    return next(
        (
            w
            for w in range(plan.workers, memory._max_workers() + 1)
            if memory._fits(plan.with_workers(w), model, capacity)
        ),
        None,
    )


@pytest.mark.parametrize("gib", [24, 40, 48])
def test_the_workers_advised_are_the_fewest_that_fit(gib: int) -> None:
    """The binary search finds what trying every count in turn finds (70B full FSDP2 on 8 GPUs)."""
    seventy_b = {**SMALL, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80}
    seventy_b.update(num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)
    document = _document({"type": "fsdp"}, gradientCheckpointing=True, microBatchSize=1)
    document["spec"]["model"]["config"] = seventy_b
    document["spec"]["dataset"]["maxSeqLength"] = 2048
    plan = memory.Plan.of_job(parse_job(document).spec)
    model = memory.Model(None, None)
    needed = memory._workers_needed(plan, model, gib * GIB)
    assert needed is not None and needed > plan.workers + 1
    assert needed == _brute_force_workers(plan, model, gib * GIB)


def test_summary_of_a_model_of_unknown_size() -> None:
    document = _document({"type": "fsdp"})
    document["spec"]["model"] = {"name": "/mnt/shared/models/mine"}
    plan = memory.Plan.of_job(parse_job(document).spec)
    assert memory.summary(plan) == (
        "not estimated before start-up: the model's size is unknown until the trainer reads its "
        "config.json (name the size in model.name, e.g. '-8B', or give model.config)"
    )


def test_summary_when_the_device_memory_is_unknown() -> None:
    document = _document({"type": "fsdp"})
    document["spec"]["resources"].pop("acceleratorType")
    plan = memory.Plan.of_job(parse_job(document).spec)
    est = memory.estimate(plan)
    assert est is not None and est.peak is not None and plan.capacity is None
    assert memory.summary(plan) == (
        f"estimated peak {memory.human_bytes(est.peak)} per GPU; the fit is not checked: the device's "
        "memory is unknown (neither resources.acceleratorType nor a MIG gpuResourceName names a known "
        f"size) ({est.breakdown()}; {memory._basis(est)})"
    )


@pytest.mark.parametrize("fits", [True, False])
def test_summary_says_whether_it_fits_with_the_peak_and_the_device(fits: bool) -> None:
    document = _document({"type": "fsdp"})
    document["spec"]["dataset"]["maxSeqLength"] = 131072
    document["spec"]["training"]["microBatchSize"] = 64  # about 46 GiB
    document["spec"]["resources"]["acceleratorType"] = "NVIDIA-H200" if fits else "NVIDIA-L4"
    plan = memory.Plan.of_job(parse_job(document).spec)
    est = memory.estimate(plan)
    assert est is not None and est.peak is not None
    verdict, device = ("fits", "141.0 GiB") if fits else ("does not fit", "24.0 GiB")
    assert memory.summary(plan) == (
        f"{verdict}: estimated peak {memory.human_bytes(est.peak)} per GPU of {device} "
        f"({est.breakdown()}; {memory._basis(est)})"
    )


def test_summary_of_a_peak_of_exactly_the_devices_memory_fits() -> None:
    plan = _plan({"type": "fsdp"})
    est = memory.estimate(plan)
    assert est is not None and est.peak is not None
    assert memory.summary(replace(plan, capacity=est.peak)).startswith("fits: ")
    assert memory.summary(replace(plan, capacity=est.peak - 1)).startswith("does not fit: ")


def test_summary_of_a_model_sized_by_its_name_counts_the_states_only() -> None:
    document = _document({"type": "fsdp"})
    document["spec"]["model"] = {"name": "org/Model-1B"}
    plan = memory.Plan.of_job(parse_job(document).spec)
    est = memory.estimate(plan)
    assert est is not None and est.peak is None
    assert memory.summary(plan) == (
        f"fits: parameters, gradients and optimizer states {memory.human_bytes(est.states)} per GPU of "
        f"80.0 GiB ({est.breakdown()}; {memory._basis(est)})"
    )

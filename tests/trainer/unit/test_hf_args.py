"""The spec → TrainingArguments mapping of trainer.type huggingface, without training."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers.training_args
from llmtrain_trainer.modes.hf_args import strategy_arguments, training_arguments, unknown_arguments

from tests.support.trainer import tiny_config


def test_arguments_derive_from_the_spec_and_pass_through_the_rest(tmp_path: Path) -> None:
    config = tiny_config(
        tmp_path,
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface", "huggingface": {"args": {"optim": "adamw_torch", "adam_beta2": 0.9}}},
        training={
            "maxSteps": 30,
            "gradientAccumulationSteps": 2,
            "lrScheduler": "constant",
            "logEverySteps": 5,
        },
        checkpoint={"everySteps": 10},
    )
    args = training_arguments(config, tmp_path / "out", evaluate=True)
    assert args.output_dir == str(tmp_path / "out")
    assert (args.max_steps, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (30, 8, 2)
    assert args.learning_rate == 0.003 and args.warmup_steps == 0.1 and args.seed == 42
    assert args.lr_scheduler_type == "constant_with_warmup"
    assert (args.logging_steps, args.save_steps, args.eval_steps) == (5, 10, 10)
    assert args.save_strategy == "steps" and args.eval_strategy == "steps"
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.optim == "adamw_torch" and args.adam_beta2 == 0.9  # passed through
    assert not args.fsdp and args.deepspeed is None


@pytest.mark.parametrize(("precision", "bf16", "fp16"), [("bf16", True, False), ("fp16", False, True)])
def test_on_gpus_precision_and_gradient_checkpointing_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, bf16: bool, fp16: bool
) -> None:
    # TrainingArguments refuses bf16 where it finds no bf16-capable GPU (this test machine).
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    config = tiny_config(
        tmp_path,
        "gpu",
        scaling={"useGpu": True},
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        training={"precision": precision, "gradientCheckpointing": True},
    )
    args = training_arguments(config, tmp_path / "out", evaluate=False)
    assert (args.bf16, args.fp16, args.use_cpu) == (bf16, fp16, False)
    assert args.activation_checkpointing and args.eval_strategy == "no"


def test_fsdp_on_gpus_loads_once_saves_sharded_and_checkpoints_inside_the_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    config = tiny_config(
        tmp_path,
        "fsdp",
        scaling={"useGpu": True},
        strategy={"type": "fsdp", "fsdp": {"reshardAfterForward": False}},
        trainer={"type": "huggingface"},
        training={"precision": "bf16", "gradientCheckpointing": True},
    )
    args = training_arguments(config, tmp_path / "out", evaluate=False)
    # What accelerate's FSDP plugin will be built from (TrainingArguments' own translation).
    plugin = args.fsdp_plugin_args
    assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is False
    assert plugin["cpu_ram_efficient_loading"] is True
    assert plugin["state_dict_type"] == "SHARDED_STATE_DICT"
    assert plugin["activation_checkpointing"] is True
    assert not args.activation_checkpointing, "no second, redundant checkpointing outside FSDP"


def test_strategies_map_to_fsdp_or_deepspeed(tmp_path: Path) -> None:
    fsdp = tiny_config(tmp_path, "f", strategy={"type": "fsdp", "fsdp": {"cpuOffload": True}})
    assert strategy_arguments(fsdp)["fsdp"] == "full_shard auto_wrap offload"
    zero = tiny_config(tmp_path, "z", strategy={"type": "deepspeed", "deepspeed": {"zeroStage": 2}})
    assert strategy_arguments(zero)["deepspeed"]["zero_optimization"] == {"stage": 2}
    assert strategy_arguments(tiny_config(tmp_path, "d", strategy={"type": "ddp"})) == {}


def test_unknown_arguments_are_named() -> None:
    assert unknown_arguments({"optim": "sgd", "optimm": "x", "adam_beta3": 1}) == ["adam_beta3", "optimm"]


def test_early_stopping_and_best_export_map_onto_the_trainers_own_settings(tmp_path: Path) -> None:
    from llmtrain_trainer.modes.hf_args import early_stopping_callbacks
    from transformers import EarlyStoppingCallback

    config = tiny_config(
        tmp_path,
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        dataset={"validationSplit": 0.1},
        training={"earlyStopping": {"patience": 3, "minDelta": 0.05}},
        checkpoint={"everySteps": 10, "exportBest": True},
    )
    args = training_arguments(config, tmp_path / "out", evaluate=True)
    assert (args.eval_strategy, args.eval_steps, args.save_steps) == ("steps", 10, 10)
    assert args.metric_for_best_model == "eval_loss" and args.greater_is_better is False
    assert args.load_best_model_at_end
    [callback] = early_stopping_callbacks(config, evaluate=True)
    assert isinstance(callback, EarlyStoppingCallback)
    assert (callback.early_stopping_patience, callback.early_stopping_threshold) == (3, 0.05)

    # Early stopping alone tracks the best but exports the final weights.
    plain = config.model_copy(
        update={"checkpoint": config.checkpoint.model_copy(update={"export_best": False})}
    )
    args = training_arguments(plain, tmp_path / "out", evaluate=True)
    assert args.metric_for_best_model == "eval_loss" and not args.load_best_model_at_end
    # No evaluation (an empty held-out set): nothing to track, no callback.
    assert early_stopping_callbacks(config, evaluate=False) == []
    assert training_arguments(config, tmp_path / "out", evaluate=False).metric_for_best_model is None


@pytest.mark.parametrize(
    ("dataset", "counted"),
    [
        ({"format": "text"}, "all"),
        ({"format": "instruction"}, "all"),  # packed by default: no attention mask to count by
        ({"format": "chat"}, "all"),
        ({"format": "instruction", "packing": False}, "non_padding"),  # the padded rows' mask
    ],
)
def test_tokens_seen_count_packed_rows_whole_and_padded_rows_by_their_mask(
    tmp_path: Path, dataset: dict[str, object], counted: str
) -> None:
    config = tiny_config(
        tmp_path, "hf", trainer={"type": "huggingface"}, strategy={"type": "ddp"}, dataset=dataset
    )
    assert (
        training_arguments(config, tmp_path / "out", evaluate=False).include_num_input_tokens_seen == counted
    )


def test_the_evaluation_cadence_maps_to_eval_steps(tmp_path: Path) -> None:
    """training.evalEverySteps → eval_steps, apart from save_steps; with exportBest the API keeps
    save_steps a multiple of it, which the Trainer demands for load_best_model_at_end."""
    config = tiny_config(
        tmp_path,
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        dataset={"validationPath": "val.jsonl"},
        training={"evalEverySteps": 5, "earlyStopping": {"patience": 2}},
        checkpoint={"everySteps": 20, "exportBest": True},
    )
    args = training_arguments(config, tmp_path / "out", evaluate=True)
    assert (args.eval_strategy, args.eval_steps, args.save_steps) == ("steps", 5, 20)
    assert args.load_best_model_at_end  # the Trainer accepts the pair (20 is a multiple of 5)

"""The spec → TrainingArguments mapping of trainer.type huggingface, without training."""

from __future__ import annotations

from pathlib import Path

from llmtrain_trainer.modes.hf_args import strategy_arguments, training_arguments, unknown_arguments

from tests.trainer.helpers import tiny_config


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


def test_strategies_map_to_fsdp_or_deepspeed(tmp_path: Path) -> None:
    fsdp = tiny_config(tmp_path, "f", strategy={"type": "fsdp", "fsdp": {"cpuOffload": True}})
    assert strategy_arguments(fsdp)["fsdp"] == "full_shard auto_wrap offload"
    zero = tiny_config(tmp_path, "z", strategy={"type": "deepspeed", "deepspeed": {"zeroStage": 2}})
    assert strategy_arguments(zero)["deepspeed"]["zero_optimization"] == {"stage": 2}
    assert strategy_arguments(tiny_config(tmp_path, "d", strategy={"type": "ddp"})) == {}


def test_unknown_arguments_are_named() -> None:
    assert unknown_arguments({"optim": "sgd", "optimm": "x", "adam_beta3": 1}) == ["adam_beta3", "optimm"]

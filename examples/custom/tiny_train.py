"""An example custom training function (trainer.type: custom, function tiny_train:train).

It trains the spec's model with plain PyTorch DDP on the spec's text file: its own data order,
optimizer and loop, with the platform's TrainContext for resume, progress and checkpoints. Every
rank runs it; only what the context does is shared with the built-in loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoConfig, AutoModelForCausalLM


def _sequences(text_file: Path, tokenizer: Any, length: int) -> torch.Tensor:
    """The whole text as one token stream, cut into rows of `length` tokens."""
    ids = tokenizer(text_file.read_text(encoding="utf-8"))["input_ids"]
    rows = len(ids) // length
    return torch.tensor(ids[: rows * length]).view(rows, length)


def train(ctx: Any) -> None:
    from llmtrain_trainer.tokenizer import load_tokenizer  # the trainer image's helpers are importable

    spec, training = ctx.config, ctx.config.training
    steps = training.max_steps or 100
    ctx.total_steps = steps
    torch.manual_seed(training.seed)
    model_config = dict(spec.model.config)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(model_config.pop("model_type"), **model_config)
    )
    model.to(ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate)
    start = 0
    state = ctx.load_checkpoint()
    if state is not None:  # resume: weights, optimizer and position of the latest checkpoint
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    elif (seed := ctx.load_seed()) is not None:  # resumeFrom.checkpoint: its weights, from step 0
        model.load_state_dict(seed["model"])
    ddp = DistributedDataParallel(model)

    tokenizer = load_tokenizer(spec.model)
    data = _sequences(Path(spec.dataset.path), tokenizer, spec.dataset.max_seq_length)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(training.seed))
    batch = training.micro_batch_size
    for step in range(start + 1, steps + 1):
        # Step-indexed slices of a fixed order: a resumed run sees the same batches.
        first = ((step - 1) * batch * ctx.world_size + ctx.rank * batch) % (len(data) - batch)
        inputs = data[order[first : first + batch]].to(ctx.device)
        loss = ddp(input_ids=inputs, labels=inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        # tokens_seen (all ranks): the platform derives tokens/s for the status from it.
        ctx.report(
            step,
            loss=float(mean) / ctx.world_size,
            learning_rate=training.learning_rate,
            tokens_seen=step * batch * ctx.world_size * data.shape[1],
        )
        if step % spec.checkpoint.every_steps == 0 or step == steps:
            ctx.save_checkpoint(
                step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            )
    if ctx.is_main and spec.checkpoint.export:
        model.save_pretrained(ctx.export_dir)
        tokenizer.save_pretrained(ctx.export_dir)
    dist.barrier()

"""Packed against padded SFT: real (non-pad) tokens per second of the same training step (CPU).

Instruction data comes in lengths spread over an order of magnitude, so a micro-batch padded to
its longest example is mostly padding; packing (dataset.packing, the default) puts whole examples
side by side in maxSeqLength rows instead, best fit decreasing (`data.best_fit_rows`), each with
its own positions, and the document mask keeps attention inside each example. This script builds
both forms of one synthetic instruction set through the trainer's own pipeline
(`build_sequences`, `DistributedBatches`, `collate`) and trains a small Llama with the DDP
strategy's step (`forward_backward`, `step`) on one gloo process, with the attention kernel the
trainer picks on a CPU.

The data is synthetic: 800 records whose token lengths (prompt + response, one byte = one token)
are log-normal, mu 4.8 and sigma 0.7 (median ~120, p10 ~48, p90 ~290), clipped to [24,
maxSeqLength - 8], seeded: a stand-in for single-turn instruction data (short prompts and replies
with a long right tail), not a measured public set. Both forms get the same padded-token budget
per micro-batch (the packed micro-batch has as many maxSeqLength rows as the padded one holds
tokens on average), so the ratio reflects the share of real tokens, not a larger matmul.

tokens/s is real tokens (the padding excluded, in both forms) per second of this process's CPU
time (one torch thread), so other processes' load on a shared machine counts less. Each form times
12 micro-batches spread evenly over one epoch of its order, 2 steps on each, the two forms taking
turns, and each micro-batch counts with its fastest step. (Keeping the fastest of several blocks
of consecutive micro-batches, as before, favours the padded form: its fill varies from block to
block, so its fastest block tends to be its fullest.)

Printed: the fill of each form over that whole epoch (real tokens over all tokens of its
micro-batch tensors: padded rows are padded to their micro-batch's longest, packed rows to theirs)
and of the packed rows alone (real tokens over rows x maxSeqLength). packed fill / padded fill
(`ratio_ceiling`) bounds the tokens/s ratio if a step's time is proportional to its tensor's
tokens. Two things keep the CPU below it: packed attention is dense over whole maxSeqLength rows
(sdpa with the document mask as a dense mask; flex_attention has no CPU backward), while a padded
row's attention spans only its micro-batch's longest example (on a GPU flex_attention skips the
blocks between examples); and the timed batches' fill differs from the epoch's
(`timed_fill`). `ratio_at_epoch_fill` takes out the latter: each form's measured tokens/s over all
tensor tokens times its epoch's fill.

    python benchmarks/packed_sft.py   # packed_sft_tokens_per_s_ratio=<packed/padded> (higher is better)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.data import DistributedBatches, build_sequences
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loss import trained_tokens
from llmtrain_trainer.model import packed_row_length
from llmtrain_trainer.strategies.ddp import DdpStrategy
from llmtrain_trainer.tokenizer import byte_level_tokenizer

MODEL = {
    "model_type": "llama",
    "vocab_size": 384,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
PAD = byte_level_tokenizer().pad_token_id
LETTERS = "abcdefghijklmnopqrstuvwxyz     "  # about one space in six characters


def write_records(path: Path, count: int, max_len: int, seed: int) -> list[int]:
    """Instruction records whose byte (= token) lengths are log-normal; returns the lengths."""
    rng = random.Random(seed)
    lengths = []
    with path.open("w") as out:
        for _ in range(count):
            total = int(min(max_len - 8, max(24, rng.lognormvariate(4.8, 0.7))))
            prompt_len = max(8, total // 3)
            text = "".join(rng.choice(LETTERS) for _ in range(total))
            prompt, response = text[:prompt_len], text[prompt_len:total]
            out.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
            lengths.append(total)
    return lengths


def config(path: Path, storage: Path, max_len: int, packing: bool) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": "packed-sft"},
            "runName": "packed-sft",
            "storagePath": str(storage),
            "scaling": {"numWorkers": 1, "useGpu": False, "cpusPerWorker": 1},
            "model": {"config": MODEL, "tokenizer": "byte-level"},
            "dataset": {
                "path": str(path),
                "format": "instruction",
                "maxSeqLength": max_len,
                "packing": packing,
            },
            "strategy": {"type": "ddp"},
            "training": {"precision": "fp32", "maxSteps": 1000, "microBatchSize": 8, "learningRate": 0.001},
            "checkpoint": {"everySteps": 1000, "export": False},
        }
    )


class Form:
    """One form of the data (packed or padded) with its own strategy and batch order."""

    def __init__(self, cfg: TrainerConfig, micro_batch: int, env: WorkerEnv) -> None:
        tokenizer = byte_level_tokenizer()
        self.rows = build_sequences(cfg.dataset, tokenizer, seed=0).train
        torch.manual_seed(0)
        self.strategy = DdpStrategy(cfg, env, total_steps=1000)
        self.batches = DistributedBatches(
            self.rows,
            micro_batch,
            0,
            1,
            0,
            pad_id=PAD,
            multiple_of=packed_row_length(cfg.dataset, self.strategy.attention),
        )
        self.timed: list[dict[str, torch.Tensor]] = []
        self.fastest: list[float] = []

        self.epoch_fill = self.mean_tokens = 0.0

    def draw(self, count: int) -> None:
        """The micro-batches to time: `count` spread evenly over the first epoch of the form's
        order, so that together they fill about as well as the whole epoch; built before the
        clock. Also that epoch's fill."""
        epoch = [self.batches.next_batch() for _ in range(self.batches.batches_per_epoch)]
        self.epoch_fill = fill(epoch)
        self.mean_tokens = statistics.mean(b["input_ids"].numel() for b in epoch)
        self.timed = [epoch[i * len(epoch) // count] for i in range(min(count, len(epoch)))]
        self.fastest = [float("inf")] * len(self.timed)

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        """One training step; returns its CPU time (other processes' load does not count)."""
        start = time.process_time()
        self.strategy.forward_backward(batch, 1.0 / max(1, trained_tokens(batch["labels"])), True)
        self.strategy.step()
        return time.process_time() - start

    def run(self) -> None:
        """One training step on each timed micro-batch; each keeps its fastest time so far."""
        for i, batch in enumerate(self.timed):
            self.fastest[i] = min(self.fastest[i], self.step(batch))

    def tokens_per_s(self, real: bool = True) -> float:
        """Real (else all) tokens of the timed micro-batches over the sum of their fastest steps."""
        count = _real_tokens if real else lambda b: b["input_ids"].numel()
        return sum(count(b) for b in self.timed) / sum(self.fastest)


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-pad tokens: the attention mask of padded rows; packed rows' padding is their last
    segment, all pad ids (which the byte tokenizer never emits for text)."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int((batch["input_ids"] != PAD).sum())


def fill(batches: list[dict[str, torch.Tensor]]) -> float:
    """Real tokens over all tokens of the micro-batches' tensors."""
    return sum(_real_tokens(b) for b in batches) / sum(b["input_ids"].numel() for b in batches)


def row_fill(form: Form, max_len: int) -> float:
    """Real tokens over the capacity of the form's rows (rows x maxSeqLength): how well packing
    fills its rows, before micro-batching."""
    return sum(len(ids) for ids in form.rows["input_ids"]) / (len(form.rows) * max_len)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=800)
    parser.add_argument("--max-seq-length", type=int, default=512)
    parser.add_argument("--batches", type=int, default=12, help="timed micro-batches per form")
    parser.add_argument("--repeats", type=int, default=2, help="steps on each timed micro-batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lengths = write_records(root / "records.jsonl", args.records, args.max_seq_length, seed=0)
        dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=0, world_size=1)
        try:
            env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
            padded_cfg = config(root / "records.jsonl", root, args.max_seq_length, packing=False)
            padded = Form(padded_cfg, 8, env)
            padded.draw(args.batches)
            # As many maxSeqLength rows as a padded micro-batch holds tokens on average.
            packed_rows = max(1, round(padded.mean_tokens / args.max_seq_length))
            packed = Form(
                config(root / "records.jsonl", root, args.max_seq_length, packing=True), packed_rows, env
            )
            packed.draw(args.batches)
            for form in (padded, packed):
                form.step(form.timed[0])  # warm-up: lazy initialisation, allocator
            for _ in range(args.repeats):
                padded.run()
                packed.run()
        finally:
            dist.destroy_process_group()
    q = statistics.quantiles(lengths, n=10)
    ratio = packed.tokens_per_s() / padded.tokens_per_s()
    # Were the timed batches exactly as full as their epoch: each form's tokens/s over all tensor
    # tokens (padding included, nearly the same for both) times its epoch's fill.
    at_epoch_fill = (packed.tokens_per_s(real=False) * packed.epoch_fill) / (
        padded.tokens_per_s(real=False) * padded.epoch_fill
    )
    result: dict[str, Any] = {
        "attention": packed.strategy.attention,
        "example_tokens": {
            "p10": q[0],
            "median": statistics.median(lengths),
            "p90": q[-1],
            "max": max(lengths),
        },
        "micro_batch_rows": {"padded": 8, "packed": packed_rows},
        "epoch_fill": {"padded": round(padded.epoch_fill, 3), "packed": round(packed.epoch_fill, 3)},
        "packed_row_fill": round(row_fill(packed, args.max_seq_length), 3),
        "ratio_ceiling": round(packed.epoch_fill / padded.epoch_fill, 2),
        "timed_fill": {"padded": round(fill(padded.timed), 3), "packed": round(fill(packed.timed), 3)},
        "all_tokens_per_s": {
            "padded": round(padded.tokens_per_s(real=False)),
            "packed": round(packed.tokens_per_s(real=False)),
        },
        "real_tokens_per_s": {"padded": round(padded.tokens_per_s()), "packed": round(packed.tokens_per_s())},
        "ratio_at_epoch_fill": round(at_epoch_fill, 2),
    }
    print(json.dumps(result), file=sys.stderr)
    print(f"packed_sft_fill padded={padded.epoch_fill:.3f} packed={packed.epoch_fill:.3f}")
    print(f"packed_sft_tokens_per_s_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()

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

Printed: the fill of each form over one whole epoch (real tokens over all tokens of its
micro-batch tensors: padded rows are padded to their micro-batch's longest, packed rows to theirs)
and of the packed rows alone (real tokens over rows x maxSeqLength). packed fill / padded fill is
the tokens/s ratio's ceiling if a step's time were proportional to its tensor's tokens; the CPU
falls short of it because its packed attention is dense over whole maxSeqLength rows (sdpa with
the document mask as a dense mask: flex_attention has no CPU backward), while a padded row's
attention spans only its micro-batch's longest example. On a GPU flex_attention skips the blocks
between examples. tokens/s is real tokens (the padding excluded, in both forms) per second of
this process's CPU time (one torch thread), so other processes' load on a shared machine does not
count; the two forms alternate block by block and the fastest block of each counts.

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
        self.best = 0.0
        self.real = self.padded = 0

    def run(self, steps: int) -> None:
        batches = [self.batches.next_batch() for _ in range(steps)]  # built before the clock
        real = sum(_real_tokens(b) for b in batches)
        start = time.process_time()  # CPU time: other processes' load does not count
        for batch in batches:
            self.strategy.forward_backward(batch, 1.0 / max(1, trained_tokens(batch["labels"])), True)
            self.strategy.step()
        self.best = max(self.best, real / (time.process_time() - start))
        self.real += real
        self.padded += sum(b["input_ids"].numel() for b in batches)


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-pad tokens: the attention mask of padded rows; packed rows' padding is their last
    segment, all pad ids (which the byte tokenizer never emits for text)."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int((batch["input_ids"] != PAD).sum())


def epoch_share(form: Form) -> float:
    """Real tokens over all tokens in one whole epoch of the form's micro-batches (no training):
    what the few timed batches sample."""
    batches = DistributedBatches(
        form.rows, form.batches.micro_batch, 0, 1, 1, PAD, multiple_of=form.batches.multiple_of
    )
    drawn = [batches.next_batch() for _ in range(batches.batches_per_epoch)]
    return sum(_real_tokens(b) for b in drawn) / sum(b["input_ids"].numel() for b in drawn)


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
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3)
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
            # As many maxSeqLength rows as a padded micro-batch holds tokens on average.
            sample = [padded.batches.next_batch()["input_ids"].numel() for _ in range(20)]
            packed_rows = max(1, round(statistics.mean(sample) / args.max_seq_length))
            packed = Form(
                config(root / "records.jsonl", root, args.max_seq_length, packing=True), packed_rows, env
            )
            for form in (padded, packed):  # warm-up: lazy initialisation, allocator
                form.run(1)
                form.best, form.real, form.padded = 0.0, 0, 0
            for _ in range(args.repeats):
                padded.run(args.steps)
                packed.run(args.steps)
        finally:
            dist.destroy_process_group()
    q = statistics.quantiles(lengths, n=10)
    fill = {"padded": epoch_share(padded), "packed": epoch_share(packed)}
    result: dict[str, Any] = {
        "attention": packed.strategy.attention,
        "example_tokens": {
            "p10": q[0],
            "median": statistics.median(lengths),
            "p90": q[-1],
            "max": max(lengths),
        },
        "micro_batch_rows": {"padded": 8, "packed": packed_rows},
        "epoch_fill": {"padded": round(fill["padded"], 3), "packed": round(fill["packed"], 3)},
        "packed_row_fill": round(row_fill(packed, args.max_seq_length), 3),
        "ratio_ceiling": round(fill["packed"] / fill["padded"], 2),
        "timed_real_token_share": {
            "padded": round(padded.real / padded.padded, 3),
            "packed": round(packed.real / packed.padded, 3),
        },
        "real_tokens_per_s": {"padded": round(padded.best), "packed": round(packed.best)},
    }
    print(json.dumps(result), file=sys.stderr)
    print(f"packed_sft_fill padded={fill['padded']:.3f} packed={fill['packed']:.3f}")
    print(f"packed_sft_tokens_per_s_ratio={packed.best / padded.best:.2f}")


if __name__ == "__main__":
    main()

"""Peak memory of the builtin loop's chunked cross-entropy against whole fp32 logits (CPU).

At the 8B Llama's vocabulary (128,256) the logits dominate a step's activations; the builtin loop
takes the loss a chunk of positions at a time (trainer loss.py). Each measurement runs one forward
and backward of a one-block Llama of small width in a fresh process and reads the process's RSS
high-water mark around it, so allocator caching of the other run cannot hide a peak.

The default sizes (seq 512, micro-batch 2, chunks of 128 positions) keep the whole-logits run near
1.5 GiB on a shared CPU machine while giving the chunks the share of a micro-batch they have in the
8B job at micro-batch 4 and seq 2048 with the trainer's chunks of LOSS_CHUNK_TOKENS (1,024): one
eighth.

    python benchmarks/loss_memory.py   # peak_memory_ratio_loss=<chunked/whole> (lower is better)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

VOCAB = 128_256


def _child(mode: str, vocab: int, hidden: int, seq: int, batch: int, chunk: int) -> None:
    import torch
    from llmtrain_trainer.loss import head_loss_forward, token_loss_sum
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    lm = LlamaForCausalLM(config)
    ids = torch.randint(0, vocab, (batch, seq))
    labels = ids.clone()
    labels[:, : seq // 4] = -100

    def step(ids: torch.Tensor, labels: torch.Tensor) -> None:
        if mode == "whole":
            loss = token_loss_sum(lm(input_ids=ids).logits, labels)
        else:
            with head_loss_forward(lm, labels, chunk):
                loss = lm(input_ids=ids).loss
        loss.backward()
        lm.zero_grad(set_to_none=False)  # gradients stay allocated: only activations differ

    step(ids[:, :8], labels[:, :8])  # warm-up: gradient buffers and lazy initialisation
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step(ids, labels)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "peak_bytes": (after - before) * 1024}))


def measure(mode: str, hidden: int, seq: int, batch: int, chunk: int) -> int:
    """Bytes the step added to the process's high-water mark (ru_maxrss is in KiB on Linux)."""
    sizes = {"--hidden": hidden, "--seq": seq, "--batch": batch, "--chunk": chunk}
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, *(str(x) for pair in sizes.items() for x in pair)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(json.loads(out.splitlines()[-1])["peak_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=["whole", "chunked"])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=128)
    args = parser.parse_args()
    if args.child:
        _child(args.child, VOCAB, args.hidden, args.seq, args.batch, args.chunk)
        return
    peaks = {
        mode: measure(mode, args.hidden, args.seq, args.batch, args.chunk) for mode in ("whole", "chunked")
    }
    for mode, peak in peaks.items():
        print(f"loss_peak_mib_{mode}={peak / 2**20:.0f}")
    print(f"peak_memory_ratio_loss={peaks['chunked'] / peaks['whole']:.3f}")


if __name__ == "__main__":
    main()

"""Chunked cross-entropy: the builtin loop's loss, taken a chunk of positions at a time from the
final hidden states, equals the whole-logits loss in value and in every gradient, through the
strategies' wrappers (DDP on one gloo process, FSDP2 over two), and holds far less memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from llmtrain_trainer import loss
from llmtrain_trainer.data import IGNORE_INDEX
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loss import chunked_token_loss_sum, head_loss_forward, token_loss_sum
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.trainer import REPO, tiny_config

CPU = torch.device("cpu")


def _batch(seed: int, rows: int = 3, length: int = 20, vocab: int = 384) -> dict[str, torch.Tensor]:
    """Rows of unequal length: right padding (masked, IGNORE_INDEX labels) and a masked prompt."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1, length - 7 :] = 0
    mask[2, length - 3 :] = 0
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    labels[0, :5] = IGNORE_INDEX  # the prompt
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _tiny_lm(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=384,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).eval()


def _loss_and_grads(
    lm: LlamaForCausalLM, batch: dict[str, torch.Tensor], chunk: int | None
) -> tuple[float, dict[str, torch.Tensor]]:
    lm.zero_grad(set_to_none=True)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if chunk is None:
        total = token_loss_sum(lm(**inputs).logits, batch["labels"])
    else:
        with head_loss_forward(lm, batch["labels"], chunk):
            total = lm(**inputs).loss
    total.backward()
    return float(total.detach()), {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [7, 16, 1024])
def test_chunked_loss_and_gradients_equal_the_whole_logits_ones(tied: bool, chunk: int) -> None:
    """Chunks that split rows, straddle padding, and one chunk for everything."""
    lm = _tiny_lm(tied)
    batch = _batch(1)
    whole, whole_grads = _loss_and_grads(lm, batch, None)
    chunked, chunked_grads = _loss_and_grads(lm, batch, chunk)
    assert chunked == pytest.approx(whole, rel=1e-6)
    assert whole_grads.keys() == chunked_grads.keys()
    assert ("lm_head.weight" in whole_grads) is not tied  # tied: one parameter, named once
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert lm.forward.__self__ is lm, "the forward is restored afterwards"


def test_no_grad_chunks_need_no_checkpoint_and_ignored_positions_count_nothing() -> None:
    hidden = torch.randn(2, 9, 8)
    head = torch.nn.Linear(8, 50, bias=False)
    labels = torch.full((2, 9), IGNORE_INDEX)
    labels[0, 3] = 4
    with torch.no_grad():
        got = chunked_token_loss_sum(hidden, head, labels, chunk_tokens=4)
        expected = token_loss_sum(head(hidden), labels)
    assert float(got) == pytest.approx(float(expected), rel=1e-6)
    assert float(got) > 0


def test_softcapped_architectures_keep_whole_logits() -> None:
    """Gemma 2 soft-caps the head's output inside its forward: a chunked head would skip that."""
    lm = _tiny_lm(True)
    assert loss.causal_lm(torch.nn.ModuleDict({"wrapped": lm})) is lm
    lm.config.final_logit_softcapping = 30.0
    assert loss.causal_lm(lm) is None


# ------------------------------------------------------------------ through the strategies


def _strategy_grads(
    strategy: Any, batch: dict[str, torch.Tensor], whole: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[float, dict[str, torch.Tensor]]:
    with monkeypatch.context() as patch:
        if whole:
            patch.setattr("llmtrain_trainer.strategies.base.causal_lm", lambda model: None)
        total = strategy.forward_backward(batch, loss_scale=1.0, last_micro_batch=True)
    grads = {}
    for name, param in strategy.model.named_parameters():
        grad = param.grad
        if hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()  # FSDP2: a collective, in the same order on every rank
        grads[name] = grad.clone()
        param.grad = None
    return float(total), grads


def test_ddp_strategy_trains_and_validates_on_the_chunked_loss(
    tmp_path: Path, one_process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmtrain_trainer.strategies.ddp import DdpStrategy

    config = tiny_config(tmp_path, "chunks", strategy={"type": "ddp"})
    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=CPU)
    strategy = DdpStrategy(config, env, total_steps=1)
    strategy.train(False)
    strategy.loss_chunk_tokens = 9
    batch = _batch(2)
    whole, whole_grads = _strategy_grads(strategy, batch, True, monkeypatch)
    chunked, chunked_grads = _strategy_grads(strategy, batch, False, monkeypatch)
    assert chunked == pytest.approx(whole, rel=1e-6)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    with torch.no_grad():
        evaluated = float(strategy.loss_sum(batch))
    assert evaluated == pytest.approx(whole, rel=1e-6)


def _fsdp_rank(rank: int, tmp_path: Path, config: Any) -> None:
    """One of two gloo processes: FSDP2 (tied embeddings sharded at the root), both loss paths.
    The config (and its files) is made once, by the parent: two ranks writing it raced."""
    from llmtrain_trainer.strategies.fsdp import FsdpStrategy

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=rank, world_size=2)
    try:
        assert config.model.config is not None and config.model.config["tie_word_embeddings"]
        strategy = FsdpStrategy(
            config, WorkerEnv(rank=rank, world_size=2, local_rank=rank, device=CPU), total_steps=1
        )
        strategy.train(False)
        strategy.loss_chunk_tokens = 11
        batch = _batch(10 + rank)  # each rank its own rows
        results: dict[str, Any] = {}
        with pytest.MonkeyPatch.context() as patch:
            whole, whole_grads = _strategy_grads(strategy, batch, True, patch)
            chunked, chunked_grads = _strategy_grads(strategy, batch, False, patch)
        results["losses"] = [whole, chunked]
        results["max_grad_difference"] = max(
            float((chunked_grads[n] - g).abs().max()) for n, g in whole_grads.items()
        )
        results["max_grad"] = max(float(g.abs().max()) for g in whole_grads.values())
        results["names"] = sorted(whole_grads)
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(results))
        dist.barrier()  # neither rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks train
def test_fsdp2_over_two_ranks_gives_the_whole_logits_gradients(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_rank, args=(tmp_path, tiny_config(tmp_path, "fsdp-chunks")), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        whole, chunked = result["losses"]
        assert chunked == pytest.approx(whole, rel=1e-6)
        assert result["max_grad"] > 0
        assert result["max_grad_difference"] <= 1e-5 * max(result["max_grad"], 1.0)
        assert "model.embed_tokens.weight" in result["names"]


# ------------------------------------------------------------------ memory


def _peak(mode: str) -> int:
    """RSS high-water (bytes) of one forward and backward at the 8B vocabulary, in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "loss_memory.py"),
            "--child",
            mode,
            "--chunk",
            "128",
            "--seq",
            "512",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    return int(json.loads(out.splitlines()[-1])["peak_bytes"])


@pytest.mark.thorough  # two fresh processes at a 128k vocabulary
def test_chunked_loss_peak_memory_is_far_below_whole_logits_at_a_128k_vocabulary() -> None:
    """Hidden 64, seq 512, batch 2, vocabulary 128,256: whole fp32 logits are 501 MiB, and the
    loss holds them, their log-softmax and gradient; chunks of 128 positions hold 63 MiB each."""
    whole, chunked = _peak("whole"), _peak("chunked")
    assert whole > 1_000 * 2**20, whole
    assert chunked * 4 < whole, (chunked, whole)

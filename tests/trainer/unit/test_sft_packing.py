"""SFT packing: several instruction/chat examples per row, each attending only to itself.

A packed row must train exactly what the examples would train one by one: the same logits on
every example token, the same per-example losses, the same trained-token count. The checks go
through a real strategy's `forward` (DDP on one gloo process) on the demo's tiny Llama.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer.data import (
    IGNORE_INDEX,
    DataPosition,
    DistributedBatches,
    Example,
    best_fit_rows,
    build_sequences,
    collate,
    encode_instruction,
    pack_examples,
    tokenize,
)
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loss import causal_lm, chunked_token_loss_sum, token_loss_sum, trained_tokens
from llmtrain_trainer.model import packed_attention, packed_row_length, unwrap_peft, use_packed_attention
from llmtrain_trainer.strategies.ddp import DdpStrategy
from llmtrain_trainer.tokenizer import byte_level_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.trainer import REPO, tiny_config

TEMPLATE = "Q: {prompt}\nA: "
PAIRS = [("Hi?", "Yes, hello."), ("What is two and two?", "Four."), ("Name a colour.", "Blue, or red.")]
INSTRUCTIONS = REPO / "examples" / "data" / "tiny-instructions.jsonl"


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return byte_level_tokenizer()


@pytest.fixture
def strategy(tmp_path: Path, one_process_group: None) -> DdpStrategy:
    config = tiny_config(
        tmp_path,
        "packing",
        strategy={"type": "ddp"},
        dataset={"path": str(INSTRUCTIONS), "format": "instruction", "maxSeqLength": 128},
    )
    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    strategy = DdpStrategy(config, env, total_steps=1)
    strategy.train(False)  # no dropout: the comparison is exact
    return strategy


def _examples(tokenizer) -> list[Example]:  # type: ignore[no-untyped-def]
    """Instruction examples around one trained from its first token (as when there is no
    prompt and no BOS): its first label must not be learned from the example before it."""
    examples = [encode_instruction(p, r, tokenizer, 64, TEMPLATE) for p, r in PAIRS]
    fully_trained = tokenizer("Green.", add_special_tokens=False)["input_ids"]
    examples.insert(1, Example(fully_trained, fully_trained))
    return examples


def _as_row(example: Example) -> dict[str, list[int]]:
    return {"input_ids": example.input_ids, "labels": example.labels}


@pytest.mark.parametrize(
    "attention",
    [
        "default",
        "sdpa",
        "eager",
        # The GPU default; compiling it for the CPU takes over a minute (forward only: CPUs
        # have no flex_attention backward).
        pytest.param("flex_attention", marks=pytest.mark.slow),
    ],
)
@torch.no_grad()
def test_packed_row_gives_each_example_its_own_logits_and_loss(
    strategy: DdpStrategy, tokenizer, attention: str
) -> None:  # type: ignore[no-untyped-def]
    if attention == "default":  # what a CPU run of packed instruction data (the default) gets
        assert strategy.config.dataset.packs_examples
        assert strategy.attention == "sdpa"
    else:
        strategy.ddp.module.set_attn_implementation(attention)
    examples = _examples(tokenizer)
    rows = pack_examples(examples, 128)
    assert len(rows["input_ids"]) == 1, "the short examples share one row"
    packed = collate([{key: rows[key][0] for key in rows}], pad_id=0)
    assert "attention_mask" not in packed
    logits = strategy.forward(packed)

    start = 0
    packed_losses, alone_losses = [], []
    for example in examples:
        n = len(example.input_ids)
        alone_batch = collate([_as_row(example)], pad_id=0)
        alone = strategy.forward(alone_batch)
        torch.testing.assert_close(logits[:, start : start + n], alone[:, :n], rtol=1e-5, atol=1e-5)
        packed_losses.append(
            float(token_loss_sum(logits[:, start : start + n], packed["labels"][:, start : start + n]))
        )
        alone_losses.append(float(token_loss_sum(alone, alone_batch["labels"])))
        start += n
    assert packed_losses == pytest.approx(alone_losses, rel=1e-5)
    # Token-weighted: the row's summed loss and trained tokens are those of the examples together.
    assert float(token_loss_sum(logits, packed["labels"])) == pytest.approx(sum(alone_losses), rel=1e-5)
    assert trained_tokens(packed["labels"]) == sum(
        trained_tokens(collate([_as_row(e)], pad_id=0)["labels"]) for e in examples
    )

    # The check can fail: attention across the boundaries (an all-ones mask switches off the
    # packed-sequence detection) or positions that do not restart change the later examples.
    first = len(examples[0].input_ids)
    crossing = strategy.forward({**packed, "attention_mask": torch.ones_like(packed["input_ids"])})
    running_positions = strategy.forward({k: v for k, v in packed.items() if k != "position_ids"})
    for ignored in (crossing, running_positions):
        torch.testing.assert_close(ignored[:, :first], logits[:, :first], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(ignored[:, first:], logits[:, first:], rtol=1e-3, atol=1e-3)


def test_chunked_loss_adds_up_each_chunks_sum_in_fp32() -> None:
    """The loop's chunked head loss over chunks that split rows and hold ignored labels is the
    whole-logits sum (each chunk summed, not averaged), with autograd (checkpointed chunks) and
    without; the total is fp32 even for bf16 hidden states with no position to score."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 8, generator=generator, requires_grad=True)
    head = torch.nn.Linear(8, 50, bias=False)
    labels = torch.randint(0, 50, (2, 9), generator=generator)
    labels[1, :5] = IGNORE_INDEX  # row 0 is scored from its first position on
    expected = float(token_loss_sum(head(hidden), labels).detach())
    with_grad = chunked_token_loss_sum(hidden, head, labels, chunk_tokens=4)
    assert with_grad.requires_grad and float(with_grad.detach()) == pytest.approx(expected, rel=1e-5)
    with torch.no_grad():
        assert float(chunked_token_loss_sum(hidden, head, labels, chunk_tokens=4)) == pytest.approx(
            expected, rel=1e-5
        )
    empty = torch.zeros(1, 0, 8, dtype=torch.bfloat16)
    total = chunked_token_loss_sum(empty, head, torch.zeros(1, 0, dtype=torch.long), chunk_tokens=4)
    assert total.dtype == torch.float32 and float(total) == 0.0


def test_the_chunked_loss_finds_the_causal_lm_inside_its_wrappers() -> None:
    """The loop takes the chunked path only when it finds the Hugging Face LM under a strategy's
    wrapper, with a decoder and a head whose output is the logits; any other model keeps whole
    logits."""
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    lm = LlamaForCausalLM(config)
    assert causal_lm(torch.nn.ModuleDict({"wrapped": lm})) is lm
    assert causal_lm(torch.nn.Linear(2, 2)) is None
    lm.config.final_logit_softcapping = 30.0  # Gemma 2's forward caps the head's output: not chunkable
    assert causal_lm(lm) is None
    lm.config.final_logit_softcapping = None
    lm.base_model_prefix = "decoder"  # no decoder under that name to run the chunked forward on
    assert causal_lm(lm) is None


def test_pack_examples_keeps_masks_and_restarts_positions(tokenizer) -> None:  # type: ignore[no-untyped-def]
    examples = _examples(tokenizer)
    lengths = [len(e.input_ids) for e in examples]
    # Best fit: the first and the last example fill a row exactly, the middle two share the other;
    # in data order (next fit) the last two would each need a row of their own.
    limit = lengths[0] + lengths[3]
    assert lengths[0] + lengths[1] + lengths[2] > limit >= lengths[1] + lengths[2]
    rows = pack_examples(examples, limit)
    assert [len(ids) for ids in rows["input_ids"]] == [limit, lengths[1] + lengths[2]]
    # Inside a row the examples keep their data order, whole.
    assert rows["input_ids"][0] == examples[0].input_ids + examples[3].input_ids
    assert rows["input_ids"][1] == examples[1].input_ids + examples[2].input_ids
    assert rows["position_ids"][0] == list(range(lengths[0])) + list(range(lengths[3]))
    assert rows["position_ids"][1] == list(range(lengths[1])) + list(range(lengths[2]))
    # Prompts stay masked, responses stay trained; each example's first label is never predicted.
    assert examples[1].labels[0] != IGNORE_INDEX
    assert rows["labels"][1] == (
        [IGNORE_INDEX, *examples[1].labels[1:], IGNORE_INDEX, *examples[2].labels[1:]]
    )
    # One token less: the rows regroup, each within the limit, no example split or lost.
    tighter = pack_examples(examples, limit - 1)
    assert all(len(ids) < limit for ids in tighter["input_ids"])
    assert sorted(tighter["input_ids"]) == sorted(
        [examples[0].input_ids + examples[2].input_ids, examples[1].input_ids + examples[3].input_ids]
    )


def _lognormal_lengths(count: int, capacity: int) -> list[int]:
    """Instruction-like example lengths: log-normal around 120 tokens (as benchmarks/packed_sft.py)."""
    rng = random.Random(0)
    return [int(min(capacity - 8, max(24, rng.lognormvariate(4.8, 0.7)))) for _ in range(count)]


def _next_fit_rows(lengths: list[int], capacity: int) -> int:
    """Rows that placing the examples in data order (the former packing) needs."""
    rows, used = 0, capacity
    for n in lengths:
        rows, used = (rows + 1, n) if used + n > capacity else (rows, used + n)
    return rows


def test_best_fit_fills_rows_far_better_than_data_order() -> None:
    """The point of best fit: on instruction-like lengths, rows are ~99% real tokens, against
    ~81% when examples are placed in data order; and it stays within 1% of the fewest rows
    possible."""
    lengths = _lognormal_lengths(2000, 512)
    rows = best_fit_rows(lengths, 512)
    fill = sum(lengths) / (len(rows) * 512)
    next_fit = sum(lengths) / (_next_fit_rows(lengths, 512) * 512)
    assert fill > 0.985
    assert next_fit < 0.83
    assert len(rows) <= 1.01 * -(-sum(lengths) // 512)
    # Every example once, whole, in a row within capacity, indices in data order.
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 512 and row == sorted(row) for row in rows)
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)


def test_best_fit_fills_rows_to_the_last_token() -> None:
    """Exact fits are taken (a capacity off by one splits these into more rows); an example
    longer than a row gets a row of its own, as before; the rows depend on the lengths only."""
    assert best_fit_rows([3, 5, 4, 4, 8, 1, 7], 8) == [[0, 1], [2, 3], [4], [5, 6]]
    assert best_fit_rows([2, 11, 3], 8) == [[0, 2], [1]]
    lengths = _lognormal_lengths(500, 256)
    assert best_fit_rows(lengths, 256) == best_fit_rows(list(lengths), 256)


def test_packed_rows_resume_exactly_after_a_rebuild(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A restart tokenises and packs again (or reads the cache) and resumes at the saved
    (epoch, offset) of the shuffled row order: the rebuilt rows must be the same rows, so two
    ranks resumed mid-epoch see exactly the batches an uninterrupted run would have seen."""
    rng = random.Random(1)
    records = Dataset.from_dict(
        {
            "prompt": [" ".join("ask" for _ in range(rng.randint(1, 12))) for _ in range(120)],
            "response": [" ".join("tell" for _ in range(rng.randint(1, 30))) for _ in range(120)],
        }
    )
    spec = DatasetSpec(path="x", format="instruction", max_seq_length=128, prompt_template=TEMPLATE)

    def walk(dataset: Dataset, steps: int, position: DataPosition) -> tuple[list[list[int]], DataPosition]:
        ranks = [DistributedBatches(dataset, 2, rank, 2, 7, 0, position) for rank in range(2)]
        seen = [ranks[r].next_batch()["input_ids"].tolist() for _ in range(steps) for r in range(2)]
        return seen, ranks[0].position

    first_build = tokenize(records, tokenizer, spec, procs=1)
    rebuilt = tokenize(records, tokenizer, spec, procs=1)
    assert rebuilt.to_dict() == first_build.to_dict()
    steps_per_epoch = len(first_build) // 4
    straight, _ = walk(first_build, steps_per_epoch + 3, DataPosition())
    before, position = walk(first_build, 2, DataPosition())
    after, _ = walk(rebuilt, steps_per_epoch + 1, position)
    assert before + after == straight


def test_collate_pads_packed_rows_as_a_segment_of_their_own() -> None:
    rows = [
        {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 6, -100, -100, 9], "position_ids": [0, 1, 0, 1, 2]},
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2]},
    ]
    batch = collate(rows, pad_id=0)
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0, 1, 2], [0, 1, 2, 0, 1, 2, 3, 4]]
    assert batch["labels"][1].tolist() == [-100, 6, 7] + [IGNORE_INDEX] * 5


@pytest.mark.parametrize("packing", [True, False, None])
def test_instruction_data_packs_unless_told_not_to(tokenizer, packing: bool | None) -> None:  # type: ignore[no-untyped-def]
    fields = {
        "path": str(INSTRUCTIONS),
        "format": "instruction",
        "maxSeqLength": 128,
        "promptTemplate": TEMPLATE,
    }
    spec = DatasetSpec.model_validate({**fields, **({} if packing is None else {"packing": packing})})
    unpacked = build_sequences(DatasetSpec.model_validate({**fields, "packing": False}), tokenizer, 0).train
    sequences = build_sequences(spec, tokenizer, 0).train
    if packing is False:  # one padded example per row only when asked
        assert "position_ids" not in sequences.column_names
        assert sequences["input_ids"] == unpacked["input_ids"]
        return
    assert len(sequences) < len(unpacked) / 2
    assert all(len(ids) <= 128 for ids in sequences["input_ids"])
    # Unpacking the rows at their position restarts gives back the examples.
    restored_ids, restored_labels = [], []
    for ids, labels, positions in zip(
        sequences["input_ids"], sequences["labels"], sequences["position_ids"], strict=True
    ):
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(ids)]
        assert positions == [p for a, b in itertools.pairwise(starts) for p in range(b - a)]
        restored_ids += [ids[a:b] for a, b in itertools.pairwise(starts)]
        restored_labels += [labels[a:b] for a, b in itertools.pairwise(starts)]
    # Best fit groups examples by length, not in data order: each comes back once, masks included.
    restored = sorted((ids, labels[1:]) for ids, labels in zip(restored_ids, restored_labels, strict=True))
    alone = sorted(
        (ids, labels[1:]) for ids, labels in zip(unpacked["input_ids"], unpacked["labels"], strict=True)
    )
    assert restored == alone
    # The sampler hands the rows with their positions to the model.
    batch = DistributedBatches(sequences, 2, 0, 1, 0, pad_id=0).next_batch()
    assert set(batch) == {"input_ids", "labels", "position_ids"}


def test_chat_data_packs_with_assistant_masks(tokenizer) -> None:  # type: ignore[no-untyped-def]
    conversations = [
        [{"role": "user", "content": f"Say {word}."}, {"role": "assistant", "content": word}]
        for word in ("one", "two", "three", "four")
    ]
    records = Dataset.from_dict({"messages": conversations})
    packed = tokenize(
        records, tokenizer, DatasetSpec(path="x", format="chat", max_seq_length=256, packing=True)
    )
    alone = tokenize(
        records, tokenizer, DatasetSpec(path="x", format="chat", max_seq_length=256, packing=False)
    )
    assert len(packed) == 1
    assert packed["input_ids"][0] == [t for ids in alone["input_ids"] for t in ids]
    assert sum(label != IGNORE_INDEX for label in packed["labels"][0]) == sum(
        label != IGNORE_INDEX for labels in alone["labels"] for label in labels[1:]
    )


@pytest.mark.slow
@pytest.mark.parametrize(("trainer", "strategy"), [("builtin", "fsdp"), ("huggingface", "ddp")])
def test_packed_instruction_run_trains(ray_address: str, storage: Path, trainer: str, strategy: str) -> None:
    """The shipped instruction data, packed, through 2 workers with validation: it trains, in the
    built-in loop and in a `transformers.Trainer` (which gets the same rows from `collate`)."""
    from llmtrain_trainer.lifecycle import LoopOptions
    from llmtrain_trainer.main import run_training

    from tests.support.trainer import losses, records

    config = tiny_config(
        storage,
        f"packed-sft-{trainer}",
        trainer={"type": trainer},
        strategy={"type": strategy},
        dataset={
            "path": str(INSTRUCTIONS),
            "format": "instruction",
            "promptTemplate": TEMPLATE,
            "maxSeqLength": 128,
            "packing": True,
            "validationSplit": 0.1,
        },
        training={"maxSteps": 20, "microBatchSize": 4, "learningRate": 0.003},
        checkpoint={"everySteps": 20},
    )
    run_training(config, LoopOptions(log_lines=False))
    curve = losses(config)
    assert curve[20] < 0.7 * curve[1]
    assert any(r.val_loss is not None for r in records(config))


def test_packed_step_gives_the_padded_step_gradients(strategy: DdpStrategy, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Through the loop's training path (`forward_backward`: chunked head loss, backward, DDP's
    reduction) one packed row and the same examples padded one per row give the same summed loss
    and the same gradients, with the default CPU kernel."""
    examples = _examples(tokenizer)
    rows = pack_examples(examples, 128)
    packed = collate([{key: rows[key][0] for key in rows}], pad_id=0)
    padded = collate([_as_row(e) for e in examples], pad_id=0)
    assert packed["input_ids"].numel() < padded["input_ids"].numel()
    tokens = trained_tokens(padded["labels"])
    assert trained_tokens(packed["labels"]) == tokens

    def gradients(batch: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
        loss = strategy.forward_backward(batch, 1.0 / tokens, last_micro_batch=True)
        grads = [p.grad.clone() for p in strategy.model.parameters() if p.grad is not None]
        strategy.model.zero_grad(set_to_none=True)
        return float(loss), grads

    packed_loss, packed_grads = gradients(packed)
    padded_loss, padded_grads = gradients(padded)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    assert len(packed_grads) == len(padded_grads) > 0
    for mine, theirs in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("fields", "on_gpu", "supports_flex", "expected"),
    [
        ({"format": "instruction"}, True, True, "flex_attention"),  # the default: packed examples
        ({"format": "chat"}, True, True, "flex_attention"),
        ({"format": "instruction"}, False, True, None),  # CPU: no flex_attention backward
        ({"format": "instruction"}, True, False, None),  # the architecture lacks flex_attention
        ({"format": "instruction", "packing": False}, True, True, None),  # padded rows
        ({"format": "text"}, True, True, None),  # packed text: one causal sequence per row
    ],
)
def test_packed_attention_choice(
    fields: dict[str, object], on_gpu: bool, supports_flex: bool, expected: str | None
) -> None:
    spec = DatasetSpec.model_validate({"path": "x", **fields})
    assert packed_attention(spec, on_gpu, supports_flex) == expected
    # flex_attention's rows all get maxSeqLength (one compiled shape), others the next multiple of 8.
    assert packed_row_length(spec, expected or "sdpa") == (spec.max_seq_length if expected else 8)


def test_use_packed_attention_switches_the_model(tmp_path: Path) -> None:
    """A GPU worker's Llama (LoRA-wrapped too) gets flex_attention for packed instruction data;
    a CPU worker's and one training padded rows keep sdpa."""
    from llmtrain.api.spec import MethodSpec
    from llmtrain_trainer.model import apply_lora, build_from_config, model_config

    config = tiny_config(tmp_path, "kernel", dataset={"path": "x", "format": "instruction"})
    lora = MethodSpec.model_validate({"type": "lora", "lora": {"targetModules": ["q_proj"]}})
    padded = config.dataset.model_copy(update={"packing": False})

    def tiny(method: MethodSpec) -> torch.nn.Module:  # a fresh config: the switch writes to it
        return apply_lora(
            build_from_config(model_config(config.model), torch.float32, meta=True, seed=0), method
        )

    for method in (config.method, lora):
        assert use_packed_attention(tiny(method), config.dataset, on_gpu=False) == "sdpa"
        assert use_packed_attention(tiny(method), padded, on_gpu=True) == "sdpa"
        model = tiny(method)
        assert use_packed_attention(model, config.dataset, on_gpu=True) == "flex_attention"
        assert all(
            layer.self_attn.config._attn_implementation == "flex_attention"
            for layer in unwrap_peft(model).model.layers
        )

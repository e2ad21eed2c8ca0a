"""Tokenisation throughput of the trainer's data path at 1 and 2 processes, and a cached restart.

Generates a text corpus (seeded pseudo-words in blank-line separated paragraphs, `--mb` MB),
loads it as the trainer does, then times only the tokenisation (dataset.format text, packed into
`--seq` token rows) with the byte-level tokenizer of the examples, once per process count. The
rows of every process count are compared with the one-process rows. Last, a cold cached build
fills a cache and a new Python process builds again: the time it reports is what a retry or
resume pays instead of tokenising.

    python benchmarks/tokenize_throughput.py [--mb 64] [--procs 1 2]

Prints `tokenize_mb_per_s_<n>procs=`, `tokenize_scaling_<n>procs=` (against 1 process) and
`tokenize_cached_restart_s=` lines. Shared machines make the numbers noisy: compare runs on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer import data
from llmtrain_trainer.tokenizer import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[1]


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """A reproducible corpus of about `megabytes` MB; returns its size in bytes."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    target, size = int(megabytes * 1e6), 0
    with path.open("w") as out:
        while size < target:
            paragraph = " ".join(rng.choices(words, k=rng.randint(20, 200))) + ".\n\n"
            out.write(paragraph)
            size += len(paragraph)
    return size


_RESTART = """
import logging, sys, time
from pathlib import Path
started = time.monotonic()
logging.basicConfig(level=logging.INFO)
from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer import data
from llmtrain_trainer.tokenizer import byte_level_tokenizer
rows = data.cached_tokenize(DatasetSpec(path=sys.argv[1], max_seq_length=int(sys.argv[3])),
                            byte_level_tokenizer(), Path(sys.argv[2]))
print(f"{time.monotonic() - started:.2f} {len(rows)}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=64.0, help="corpus size in MB")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts to time")
    parser.add_argument("--seq", type=int, default=2048, help="dataset.maxSeqLength")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = byte_level_tokenizer()
    with tempfile.TemporaryDirectory(prefix="llmtrain-tokenize-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        size = write_corpus(corpus, args.mb)
        spec = DatasetSpec(path=str(corpus), max_seq_length=args.seq)
        records = data.load_records(spec)  # the json/text → arrow conversion is not timed
        print(f"corpus: {size / 1e6:.1f} MB, {len(records)} records, available_cpus={data.available_cpus()}")
        rates: dict[int, float] = {}
        reference = None
        for procs in args.procs:
            started = time.monotonic()
            rows = data.tokenize(records, tokenizer, spec, procs=procs)
            seconds = time.monotonic() - started
            rates[procs] = size / 1e6 / seconds
            print(f"tokenize_mb_per_s_{procs}procs={rates[procs]:.2f}  ({seconds:.1f} s, {len(rows)} rows)")
            table = rows.data.table
            if reference is None:
                reference = table
            elif not table.equals(reference):
                raise SystemExit(f"{procs} processes produced other rows than {args.procs[0]}")
        for procs in args.procs[1:]:
            print(f"tokenize_scaling_{procs}procs={rates[procs] / rates[args.procs[0]]:.2f}")

        cache = Path(tmp) / "cache"
        started = time.monotonic()
        data.cached_tokenize(spec, tokenizer, cache)
        print(f"tokenize_cold_cached_build_s={time.monotonic() - started:.2f}  (load + tokenise + publish)")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "trainer_image"), str(REPO / "operator")]),
        }
        done = subprocess.run(
            [sys.executable, "-c", _RESTART, str(corpus), str(cache), str(args.seq)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        seconds, count = done.stdout.split()
        if "tokenised dataset cache hit" not in done.stderr:
            raise SystemExit("the restart did not load the cache")
        print(
            f"tokenize_cached_restart_s={float(seconds):.2f}  (new process, imports included, {count} rows)"
        )


if __name__ == "__main__":
    main()

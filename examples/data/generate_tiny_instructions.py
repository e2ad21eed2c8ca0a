"""Writes tiny-instructions.jsonl: small arithmetic questions and answers, a supervised fine-tuning
set a byte-level model learns in a few dozen steps on CPU (examples/tiny-cpu-hf.yaml)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = {"+": "plus", "-": "minus"}


def main() -> None:
    rng = random.Random(13)
    lines = []
    for _ in range(400):
        a, b, op = rng.randint(0, 20), rng.randint(0, 20), rng.choice("+-")
        answer = a + b if op == "+" else a - b
        lines.append(
            json.dumps({"prompt": f"What is {a} {WORDS[op]} {b}?", "response": f"{a} {op} {b} = {answer}."})
        )
    (Path(__file__).parent / "tiny-instructions.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

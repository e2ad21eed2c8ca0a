"""Generate `tiny-stories.txt`: short, simple English stories for the CPU demo and the tests.

The text comes from a small seeded grammar, so it is reproducible, free of licences and easy
enough for a 100k-parameter byte-level model to learn within a couple of minutes on a CPU
(the demo's target is a loss at most half its starting value). Stories are separated by blank
lines; the trainer reads one record per paragraph.

    python examples/data/generate_tiny_stories.py            # rewrites tiny-stories.txt
    python examples/data/generate_tiny_stories.py --check    # fails if the file is stale
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

SEED = 2024
STORIES = 900
OUTPUT = Path(__file__).with_name("tiny-stories.txt")

NAMES = ["Tom", "Lily", "Max", "Mia", "Ben", "Anna", "Sam", "Lucy", "Tim", "Sue"]
ANIMALS = ["cat", "dog", "bird", "frog", "duck", "bunny", "fox", "bear"]
PLACES = ["park", "garden", "forest", "beach", "farm", "house", "river", "hill"]
THINGS = ["ball", "kite", "box", "hat", "book", "cake", "toy", "boat", "red car", "big drum"]
COLORS = ["red", "blue", "green", "yellow", "pink", "little", "shiny", "soft"]
FEELINGS = ["happy", "sad", "scared", "tired", "excited", "hungry", "surprised"]
VERBS = ["play", "run", "jump", "sing", "dance", "swim", "read", "look around"]
WEATHER = ["sunny", "rainy", "windy", "warm", "cold", "bright"]


def story(rng: random.Random) -> str:
    hero, friend = rng.sample(NAMES, 2)
    animal, place, thing = rng.choice(ANIMALS), rng.choice(PLACES), rng.choice(THINGS)
    color, feeling, verb = rng.choice(COLORS), rng.choice(FEELINGS), rng.choice(VERBS)
    weather = rng.choice(WEATHER)
    opening = rng.choice(
        [
            f"Once upon a time, there was a {color} {animal} named {hero}.",
            f"One {weather} day, {hero} went to the {place}.",
            f"{hero} had a {color} {thing}. {hero} loved it very much.",
        ]
    )
    middle = rng.sample(
        [
            f"{hero} wanted to {verb} with {friend}.",
            f"At the {place}, {hero} saw a {color} {thing}.",
            f'{friend} said, "Can I {verb} with you?"',
            f"{hero} felt {feeling} and looked at the {thing}.",
            f"The {animal} liked to {verb} in the {place}.",
            f"It was a {weather} day, and the sky was big.",
        ],
        k=rng.randint(2, 4),
    )
    ending = rng.choice(
        [
            f"{hero} and {friend} played with the {thing} all day. They were very happy.",
            f"In the end, {hero} shared the {thing} with {friend}. They became best friends.",
            f"Then {hero} went home and had a nap. {hero} was not {feeling} anymore.",
            f"{friend} gave {hero} a big hug. The {animal} smiled.",
        ]
    )
    return " ".join([opening, *middle, ending])


def generate(seed: int = SEED, count: int = STORIES) -> str:
    rng = random.Random(seed)
    return "\n\n".join(story(rng) for _ in range(count)) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT} ({len(text.encode())} bytes, {STORIES} stories)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every product module is on its map: the README's architecture block lists each module of
`operator/llmtrain/`, and trainer_image/README.md's module table each module of `llmtrain_trainer/`.

The modules are read from the tree when the test runs, so a new file fails here until a reader can
find it on the map; a map entry whose file is gone fails too. An `__init__.py` counts as a module
when it defines a function or a class (render's `render()`, `make_strategy`), not when it only
re-exports or holds a docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_PACKAGE = ROOT / "operator" / "llmtrain"
TRAINER_PACKAGE = ROOT / "trainer_image" / "llmtrain_trainer"
# A bare module name: not part of a path such as `operator/permissions.py` (a mention, not an entry).
MODULE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def product_modules(package: Path) -> set[str]:
    """Paths relative to the package, e.g. `api/spec.py`, `render/__init__.py`."""
    modules = set()
    for path in package.rglob("*.py"):
        if path.name == "__init__.py" and not _defines_something(path):
            continue
        modules.add(path.relative_to(package).as_posix())
    return modules


def _defines_something(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body)


def architecture_map(readme: str) -> set[str]:
    """The modules the README's architecture block lists under `operator/llmtrain/`.

    Within the block, a line `  pkg/  a.py b.py ...` starts package `pkg`, and deeper-indented lines
    after it continue it; a line `  name.py ...` at the package's own indent is a top-level module.
    """
    section = readme.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, flags=re.DOTALL)
    assert block, "README.md's Architecture section has no code block"
    lines = block[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("operator/llmtrain/"))
    listed: set[str] = set()
    package = ""
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break  # the next top-level entry (operator/Dockerfile, ...)
        stripped = line.strip()
        head = stripped.split()[0]
        indent = len(line) - len(line.lstrip())
        if indent == 2 and head.endswith("/"):
            package = head
        elif indent == 2:
            package = ""
        listed |= {package + name for name in MODULE.findall(stripped)}
    return listed


def trainer_module_table(readme: str) -> set[str]:
    """The modules trainer_image/README.md's `## Modules` table lists: `a.py` in the first cell, or
    for a package row (`pkg/`) the `b.py` names in its description."""
    section = readme.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    listed: set[str] = set()
    for row in re.findall(r"^\|(.+?)\|(.+)\|$", section, flags=re.MULTILINE):
        first, rest = row
        packages = re.findall(r"`(\w+/)`", first)
        if packages:
            listed |= {f"{packages[0]}{name}" for name in re.findall(r"`(\w+\.py)`", rest)}
        else:
            listed |= set(re.findall(r"`(\w+\.py)`", first))
    return listed


MAPS = {
    "README.md architecture map (operator/llmtrain/)": (
        OPERATOR_PACKAGE,
        ROOT / "README.md",
        architecture_map,
    ),
    "trainer_image/README.md module table (llmtrain_trainer/)": (
        TRAINER_PACKAGE,
        ROOT / "trainer_image" / "README.md",
        trainer_module_table,
    ),
}


@pytest.mark.parametrize("name", list(MAPS))
def test_every_product_module_is_on_its_map(name: str) -> None:
    package, readme, parse = MAPS[name]
    missing = product_modules(package) - parse(readme.read_text())
    assert not missing, f"{name} lacks {sorted(missing)}: add a line saying what each does"


@pytest.mark.parametrize("name", list(MAPS))
def test_every_map_entry_is_a_module(name: str) -> None:
    package, readme, parse = MAPS[name]
    stale = {m for m in parse(readme.read_text()) if not (package / m).is_file()}
    assert not stale, f"{name} lists modules that do not exist: {sorted(stale)}"


def test_the_parsers_read_the_maps_as_written() -> None:
    """The parsers see nested packages and top-level modules (a parser that saw nothing would pass
    the stale check and fail only the missing one, with a confusing message)."""
    operator_map = architecture_map((ROOT / "README.md").read_text())
    assert {"cli.py", "api/spec.py", "render/rayjob.py", "operator/kube.py"} <= operator_map
    trainer_map = trainer_module_table((ROOT / "trainer_image" / "README.md").read_text())
    assert {"main.py", "tokenizer.py", "strategies/fsdp.py", "modes/custom.py"} <= trainer_map


def test_a_new_module_fails_until_it_is_mapped(tmp_path: Path) -> None:
    """Seeded: a package with one more module than its map lists is caught, wherever it sits."""
    package = tmp_path / "llmtrain"
    (package / "api").mkdir(parents=True)
    (package / "cli.py").write_text("")
    (package / "api" / "spec.py").write_text("")
    (package / "api" / "__init__.py").write_text('"""docstring only"""\n')
    readme = "\n## Architecture\n\n```\noperator/llmtrain/\n  api/  spec.py\n  cli.py  the CLI\n```\n"
    assert product_modules(package) - architecture_map(readme) == set()
    (package / "api" / "new.py").write_text("")
    (package / "api" / "__init__.py").write_text("def registry() -> None: ...\n")
    assert product_modules(package) - architecture_map(readme) == {"api/new.py", "api/__init__.py"}

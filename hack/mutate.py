"""`make mutate`: mutation testing of the core with mutmut 3, incremental, with a score.

mutmut names a mutant after its file's path with a leading `src/` stripped, and the trampoline it
puts in each mutated function records the function's real module (`llmtrain.memory`). Our packages
sit under `operator/` and `trainer_image/`, whose paths would name them `operator.llmtrain...`, and
every mutant would count as untested. So mutmut runs in `.mutate/`, where `src/llmtrain` and
`src/llmtrain_trainer` are links to the packages: mutmut copies them into `.mutate/mutants/src/`.
In `.mutate/mutants/`, where the tests run, `operator/llmtrain` and `trainer_image/llmtrain_trainer`
are links to that mutated copy, so tests/conftest.py puts it first on sys.path and PYTHONPATH as it
does for any checkout; everything else (charts, examples, Dockerfiles) is linked there as it is.

What is mutated, which tests run and the equivalent mutants (with their reasons) are in
pyproject.toml's [tool.mutmut]. mutmut keeps every verdict in `.mutate/mutants/` and tests again
only the functions whose code changed; survivors are also tested again whenever tests/ changed,
since a new test may kill them. Arguments are mutant-name globs, passed to `mutmut run`
(`make mutate MUTATE_ARGS='llmtrain.memory.*'`). Prints `mutation_score=` and every survivor;
exits 1 below the threshold.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / ".mutate"
MUTANTS = STAGE / "mutants"
PACKAGES = {
    "llmtrain": REPO / "operator" / "llmtrain",
    "llmtrain_trainer": REPO / "trainer_image" / "llmtrain_trainer",
}
# Never linked into mutants/: the sources (the mutated copy stands in for them), the files mutmut
# copies there itself (a link would make it write into the checkout), and local state.
NOT_LINKED = {"operator", "trainer_image", "tests", "pyproject.toml", "setup.cfg", ".git", ".venv", ".mutate"}
# Statuses that count as killed (mutmut.stats.status_by_exit_code's names).
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_RUN = {"not checked", "skipped", "check was interrupted by user"}


def _link(link: Path, target: Path | str) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    link.symlink_to(target)


def stage() -> None:
    """Lay out .mutate/ (see the module docstring); cheap and idempotent."""
    (STAGE / "src").mkdir(parents=True, exist_ok=True)
    for name, path in PACKAGES.items():
        _link(STAGE / "src" / name, path)
    _link(STAGE / "tests", REPO / "tests")
    # A copy, not a link: mutmut reads its [tool.mutmut] and copies it into mutants/.
    shutil.copy2(REPO / "pyproject.toml", STAGE / "pyproject.toml")
    MUTANTS.mkdir(exist_ok=True)
    # mutmut takes a copy newer than its source for an up-to-date mutant file, so a module added to
    # only_mutate after a run would stay unmutated: its plain copy (no .meta) is dropped.
    only = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    for copy in (MUTANTS / "src").rglob("*.py"):
        relative = str(copy.relative_to(MUTANTS))
        if any(fnmatch.fnmatch(relative, p) for p in only) and not Path(f"{copy}.meta").exists():
            copy.unlink()
    for package, path in PACKAGES.items():
        # operator/ and trainer_image/ hold the mutated package and, as they are, the rest
        # (Dockerfiles, fabric files) that tests read.
        root = MUTANTS / path.parent.name
        if root.is_symlink():
            root.unlink()
        root.mkdir(exist_ok=True)
        for entry in path.parent.iterdir():
            if entry.name != package and entry.name != "__pycache__":
                _link(root / entry.name, entry)
        _link(root / package, Path("..") / "src" / package)
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED and not entry.name.endswith("_cache"):
            _link(MUTANTS / entry.name, entry)


def _tests_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((REPO / "tests").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def verdicts() -> dict[str, str]:
    """Every mutant's status, from the .meta files mutmut writes beside each mutated file."""
    from mutmut.stats import status_by_exit_code

    result: dict[str, str] = {}
    for meta in sorted((MUTANTS / "src").rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            result[name] = status_by_exit_code[code]
    return result


def mutmut(*args: str) -> None:
    """Run mutmut in the stage, at low priority: mutation runs share the machine."""
    command = [sys.executable, "-m", "mutmut", *args]
    subprocess.run(command, cwd=STAGE, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutant-name globs to (re)run; all by default")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=90.0)
    parser.add_argument("--report-only", action="store_true", help="print the score of the last runs")
    options = parser.parse_args()

    stage()
    if not options.report_only:
        children = ("--max-children", str(options.max_children))
        mutmut("run", *children, *options.names)
        digest_file = STAGE / "tests.sha256"
        digest = _tests_digest()
        if digest_file.exists() and digest_file.read_text() != digest and not options.names:
            survivors = [n for n, s in verdicts().items() if s in {"survived", "no tests"}]
            if survivors:
                print(f"tests/ changed: testing the {len(survivors)} survivors again")
                mutmut("run", *children, *survivors)
        digest_file.write_text(digest)

    status = verdicts()
    judged = {n: s for n, s in status.items() if s not in NOT_RUN}
    killed = sum(s in KILLED for s in judged.values())
    for name, verdict in sorted(judged.items()):
        if verdict not in KILLED:
            print(f"{verdict}: {name}")
    score = 100.0 * killed / len(judged) if judged else 0.0
    not_run = len(status) - len(judged)
    print(f"mutants={len(status)} judged={len(judged)} killed={killed} not_run={not_run}")
    print(f"mutation_score={score:.1f}")
    return 0 if score >= options.threshold and not not_run else 1


if __name__ == "__main__":
    sys.exit(main())

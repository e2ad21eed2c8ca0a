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
pyproject.toml's [tool.mutmut]. mutmut keeps its verdicts in `.mutate/mutants/**.py.meta` (ignored,
so lost with the machine); the committed store, tests/mutation/verdicts.json, keeps them across
checkouts: for each mutated function, mutmut's hash of its source and its mutants' exit codes, for
each file the digest of the do_not_mutate_patterns that match its lines (they shift the mutants'
numbers), and the digest of the tests. A run first has mutmut generate the mutants, then gives every
mutant without a verdict the store's, where its function's hash and its file's pattern digest are
the same; a survivor only while the tests digest is too (killed stays killed). It then tests only
the mutants still without a verdict, and writes the store back from the .meta files, also when
interrupted. Arguments are mutant-name globs: only the matching mutants without a verdict are
tested (`--again`: all the matching ones). Prints `mutation_score=` and every survivor, counting
the restored verdicts; exits 1 below the threshold or while a mutant is untested. A survivor that
tests/mutation/equivalent.toml explains (see equivalence()) is listed with its reason and left out
of the score.

`--screen` is a fast first pass over the same mutants (see screen()): it writes only kills, and a
later run without it has mutmut judge the rest.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / ".mutate"
MUTANTS = STAGE / "mutants"
# The verdicts, committed: see main().
STORE = REPO / "tests" / "mutation" / "verdicts.json"
# Survivors no test can tell from the code, each with why, committed beside the store: see
# equivalence().
EQUIVALENT = REPO / "tests" / "mutation" / "equivalent.toml"
# What the verdicts in .mutate/ were made with: the tests digest and each file's pattern digest.
TESTS_SEEN = STAGE / "tests.sha256"
PATTERNS_SEEN = STAGE / "patterns.json"
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
    only = _mutmut_config()["only_mutate"]
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


def _mutmut_config(repo: Path = REPO) -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["mutmut"]
    return config


def _tests_digest(repo: Path = REPO) -> str:
    """What a survivor's verdict depends on besides its code: the tests and how they are chosen."""
    digest = hashlib.sha256()
    for path in sorted((repo / "tests").rglob("*.py")):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    config = _mutmut_config(repo)
    for key in ("pytest_add_cli_args_test_selection", "pytest_add_cli_args"):
        digest.update(json.dumps(config.get(key, [])).encode())
    return digest.hexdigest()


def mutated_sources(repo: Path = REPO) -> dict[str, Path]:
    """Each mutated file by mutmut's name for it (`src/llmtrain/memory.py`), with its source."""
    only = _mutmut_config(repo)["only_mutate"]
    result: dict[str, Path] = {}
    for name, path in PACKAGES.items():
        source_root = repo / path.relative_to(REPO)
        for source in sorted(source_root.rglob("*.py")):
            relative = f"src/{name}/{source.relative_to(source_root)}"
            if any(fnmatch.fnmatch(relative, p) for p in only):
                result[relative] = source
    return result


def pattern_digest(source: str, patterns: list[str]) -> str:
    """The do_not_mutate_patterns that match a line of `source`: mutmut numbers a function's
    mutants in order, so a pattern added, removed or changed there shifts the numbers after it."""
    lines = source.splitlines()
    matching = sorted(p for p in patterns if any(re.search(p, line) for line in lines))
    return hashlib.sha256(json.dumps(matching).encode()).hexdigest()[:16]


def pattern_digests(repo: Path = REPO) -> dict[str, str]:
    patterns = _mutmut_config(repo).get("do_not_mutate_patterns", [])
    return {name: pattern_digest(path.read_text(), patterns) for name, path in mutated_sources(repo).items()}


def split_key(key: str) -> tuple[str, str]:
    """`llmtrain.memory.x_plan__mutmut_12` -> (`x_plan`, `12`), the function as mutmut's .meta
    names it in hash_by_function_name, and the mutant's number within it."""
    function, _, number = key.rpartition("__mutmut_")
    return function.rpartition(".")[2], number


def module_of(key: str) -> str:
    """`llmtrain.memory.x_plan__mutmut_12` -> `llmtrain.memory` (a method's is `xǁClassǁname`)."""
    parts = key.rpartition("__mutmut_")[0].split(".")
    while parts and not parts[-1].startswith(("x_", "xǁ")):
        parts.pop()
    return ".".join(parts[:-1])


def status(code: int | None) -> str:
    from mutmut.stats import status_by_exit_code

    return str(status_by_exit_code[code])


# The .meta files: mutmut's name for the mutated file -> its parsed JSON.
Metas = dict[str, dict[str, Any]]


def load_metas(mutants: Path) -> Metas:
    return {
        str(meta.relative_to(mutants))[: -len(".meta")]: json.loads(meta.read_text())
        for meta in sorted((mutants / "src").rglob("*.py.meta"))
    }


def save_metas(metas: Metas, names: set[str], mutants: Path) -> None:
    for name in names:
        (mutants / f"{name}.meta").write_text(json.dumps(metas[name], indent=4))


def forget_survivors(metas: Metas) -> set[str]:
    """Clear every verdict that is neither killed nor unrun, so that it is tested again; returns
    the files changed."""
    changed = set()
    for name, meta in metas.items():
        for key, code in meta["exit_code_by_key"].items():
            if code is not None and status(code) not in KILLED | NOT_RUN:
                meta["exit_code_by_key"][key] = None
                changed.add(name)
    return changed


def restore(
    store: dict[str, Any], metas: Metas, tests: str, patterns: dict[str, str]
) -> tuple[int, set[str]]:
    """Fill the mutants of `metas` that have no verdict from the store, where the file's patterns
    and the function's hash are the store's; survivors only when the tests are the store's too.
    Returns the number restored and the files changed."""
    same_tests = store.get("tests") == tests
    restored, changed = 0, set()
    for name, meta in metas.items():
        entry = store.get("files", {}).get(name)
        if entry is None or entry["patterns"] != patterns.get(name):
            continue
        hashes = meta["hash_by_function_name"]
        codes = meta["exit_code_by_key"]
        for key, code in codes.items():
            function, number = split_key(key)
            stored = entry["functions"].get(function)
            if code is not None or stored is None or stored["hash"] != hashes.get(function):
                continue
            verdict = stored["exit_codes"].get(number)
            if verdict is not None and (same_tests or status(verdict) in KILLED):
                codes[key] = verdict
                restored += 1
                changed.add(name)
    return restored, changed


def export(metas: Metas, tests: str, patterns: dict[str, str]) -> dict[str, Any]:
    """The store for `metas`: each function's hash and the exit codes of its judged mutants."""
    files: dict[str, Any] = {}
    for name, meta in sorted(metas.items()):
        functions: dict[str, Any] = {}
        for key, code in meta["exit_code_by_key"].items():
            function, number = split_key(key)
            digest = meta["hash_by_function_name"].get(function)
            if code is None or digest is None or status(code) in NOT_RUN:
                continue
            functions.setdefault(function, {"hash": digest, "exit_codes": {}})["exit_codes"][number] = code
        if functions and name in patterns:
            files[name] = {"patterns": patterns[name], "functions": functions}
    return {"format": 1, "tests": tests, "files": files}


def store_text(store: dict[str, Any]) -> str:
    """Sorted, one function a line, so that a diff shows which functions' verdicts changed."""

    def dump(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)

    lines = ["{", f' "format": {dump(store["format"])},', f' "tests": {dump(store["tests"])},', ' "files": {']
    files = sorted(store["files"].items())
    for i, (name, entry) in enumerate(files):
        lines.append(f"  {dump(name)}: {{")
        lines.append(f'   "patterns": {dump(entry["patterns"])},')
        lines.append('   "functions": {')
        functions = sorted(entry["functions"].items())
        for j, (function, data) in enumerate(functions):
            codes = {n: data["exit_codes"][n] for n in sorted(data["exit_codes"], key=int)}
            body = f'{{"hash": {dump(data["hash"])}, "exit_codes": {json.dumps(codes)}}}'
            lines.append(f"    {dump(function)}: {body}" + ("," if j < len(functions) - 1 else ""))
        lines.append("   }")
        lines.append("  }" + ("," if i < len(files) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def read_store(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"format": 1, "tests": "", "files": {}}
    store: dict[str, Any] = json.loads(path.read_text())
    return store


def write_store(store: dict[str, Any], path: Path) -> None:
    text = store_text(store)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# Run in .mutate/: mutmut's own first step of `mutmut run`, generating every mutant (a file whose
# copy is newer than its source is kept), without its tests. mutmut drops every verdict when the
# test settings in its stats differ from the config: the stats go instead (it then collects them
# again, as it would), so that the verdicts restored from the store stand.
GENERATE = """
import json, sys
from pathlib import Path
from mutmut.__main__ import (copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths,
    store_lines_covered_by_tests)
from mutmut.configuration import config
from mutmut.mutation.trampoline import set_mutant_under_test
set_mutant_under_test("mutant_generation")
copy_src_dir()
copy_also_copy_files()
setup_source_paths()
store_lines_covered_by_tests()
create_mutants(int(sys.argv[1]))
stats = Path("mutants/mutmut-stats.json")
if stats.exists():
    if json.loads(stats.read_text()).get("config_fingerprint") != config().config_fingerprint():
        stats.unlink()
"""


def generate(max_children: int, patterns: dict[str, str]) -> None:
    """Make every mutant, dropping first the copies of files whose patterns (`pattern_digests`)
    changed since."""
    seen = json.loads(PATTERNS_SEEN.read_text()) if PATTERNS_SEEN.exists() else {}
    for name, digest in patterns.items():
        if seen.get(name) != digest:
            for suffix in ("", ".meta", ".spans"):
                (MUTANTS / f"{name}{suffix}").unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-c", GENERATE, str(max_children)], cwd=STAGE, check=True, stdout=subprocess.DEVNULL
    )
    PATTERNS_SEEN.write_text(json.dumps(patterns, indent=1, sort_keys=True))


def mutmut(*args: str) -> None:
    """`mutmut run` in the stage. Interrupted (Ctrl-C, or SIGTERM turned into KeyboardInterrupt by
    main), it gets one SIGINT (in a session of its own, a terminal's Ctrl-C does not reach it twice):
    mutmut stops its workers, and its .meta files keep every verdict so far."""
    process = subprocess.Popen([sys.executable, "-m", "mutmut", *args], cwd=STAGE, start_new_session=True)
    try:
        code = process.wait()
    except BaseException:
        # A second Ctrl-C or SIGTERM (`pkill` reaches a `timeout` wrapper and this script alike)
        # must not cut short mutmut's stop: its .meta files hold the verdicts.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
    if code:
        raise subprocess.CalledProcessError(code, process.args)


# --screen: a fast first pass. mutmut tests each mutant in a process of its own; the screen runs the
# mutants of a file one after the other in ONE pytest process, switching them with
# MUTANT_UNDER_TEST, which mutmut's trampolines read at each call. State can outlive a mutant there
# (a functools.cache, a module-scoped fixture), so a kill counts only when the failing test passes
# again at once without the mutant, and the screen writes nothing else: a mutant its tests did not
# kill, or one that hung, is left without a verdict for mutmut's own run.
SCREEN_KILLED = 1  # mutmut's exit code for "killed"
# By default, the fastest tests of a mutant's function that a screen runs (`--screen-tests`): a
# kill mostly comes from the first few, and a mutant that passes them all waits for mutmut's run.
SCREEN_MAX_TESTS = 40
SCREEN_LIMIT_S = 60.0  # a mutant whose tests run longer than this plus ten times their usual time hung
# Which tests reach which mutated function, and each test's time, recorded by the screen itself
# (mutmut's own stats shrink to the modules its last run mutated): kept while the tests digest holds.
REACH = STAGE / "screen-reach.json"


def screen_verdict(failed_with_mutant: bool, passed_without: bool) -> int | None:
    """What a screen may write for a mutant: killed, when a test failed with it and passed right
    after without it; nothing otherwise (a survivor or a doubtful kill waits for mutmut's run)."""
    return SCREEN_KILLED if failed_with_mutant and passed_without else None


def apply_screen(metas: Metas, verdicts: dict[str, int | None]) -> set[str]:
    """Write a screen's verdicts into mutants that have none (never over mutmut's own); returns the
    files changed."""
    changed = set()
    for name, meta in metas.items():
        codes = meta["exit_code_by_key"]
        for key, verdict in verdicts.items():
            if key in codes and codes[key] is None and verdict == SCREEN_KILLED:
                codes[key] = verdict
                changed.add(name)
    return changed


def screen_plan(
    todo: list[str], stats: dict[str, Any], most: int = SCREEN_MAX_TESTS
) -> list[tuple[str, list[str]]]:
    """Each mutant with the `most` fastest tests that reach its function, fastest first; a mutant
    no test reaches is left out (mutmut's run records it as `no tests`)."""
    by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    duration: dict[str, float] = stats["duration_by_test"]
    plan = []
    for key in todo:
        tests = by_function.get(key.rpartition("__mutmut_")[0], [])
        if tests:
            fastest = sorted(set(tests), key=lambda t: (duration.get(t, 0.0), t))
            plan.append((key, fastest[:most]))
    return plan


class _Screen:
    """The pytest plugin of a screen's worker: runs the plan instead of the session's tests and
    appends one JSON line per mutant to `progress`: {"mutant", "event": start|killed|survived|doubtful}."""

    def __init__(self, plan: list[tuple[str, list[str]]], progress: Path) -> None:
        self.plan = plan
        self.progress = progress

    def _note(self, mutant: str, event: str) -> None:
        with self.progress.open("a") as out:
            out.write(json.dumps({"mutant": mutant, "event": event}) + "\n")

    def pytest_runtestloop(self, session: Any) -> bool:
        from _pytest.runner import runtestprotocol

        items = {item.nodeid: item for item in session.items}

        def passes(item: Any) -> bool:
            reports = runtestprotocol(item, nextitem=None, log=False)
            return not any(report.failed for report in reports)

        for mutant, tests in self.plan:
            self._note(mutant, "start")
            _clear_caches()
            os.environ["MUTANT_UNDER_TEST"] = mutant
            failing = next((items[t] for t in tests if t in items and not passes(items[t])), None)
            os.environ["MUTANT_UNDER_TEST"] = ""
            _clear_caches()
            verdict = screen_verdict(failing is not None, failing is not None and passes(failing))
            event = "killed" if verdict == SCREEN_KILLED else "doubtful" if failing else "survived"
            self._note(mutant, event)
        return True


class _Reach:
    """The pytest plugin of the screen's first run: with MUTANT_UNDER_TEST=stats, mutmut's
    trampolines note each mutated function a test calls; this keeps them per test, with its time."""

    def __init__(self) -> None:
        self.tests_by_function: dict[str, list[str]] = {}
        self.duration: dict[str, float] = {}

    def pytest_runtest_teardown(self, item: Any) -> None:
        from mutmut.state import state

        for function in state()._stats:
            self.tests_by_function.setdefault(function, []).append(item.nodeid)
        state()._stats.clear()

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.duration[report.nodeid] = self.duration.get(report.nodeid, 0.0) + report.duration


def _clear_caches() -> None:
    """Empty every functools cache of the packages: a value cached under one mutant is not another's."""
    for module in list(sys.modules.values()):
        if module is not None and module.__name__.startswith(tuple(PACKAGES)):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def screen_worker(mode: str, plan_file: Path, progress: Path) -> int:
    """A screen's pytest process, in .mutate/mutants/ with mutmut's pytest settings: `reach` runs
    the test selection to write REACH, `plan` the plan's mutants."""
    import pytest

    config = _mutmut_config()
    tail = ["--rootdir=.", "--tb=no", "-q", "-p", "no:randomly", *config["pytest_add_cli_args"]]
    if mode == "reach":
        os.environ["MUTANT_UNDER_TEST"] = "stats"
        os.environ["MUTMUT_DEPENDENCY_DEPTH"] = "-1"
        reach = _Reach()
        code = int(pytest.main([*config["pytest_add_cli_args_test_selection"], *tail], plugins=[reach]))
        stats = {
            "tests_by_mangled_function_name": reach.tests_by_function,
            "duration_by_test": reach.duration,
        }
        progress.write_text(json.dumps(stats))
        return code
    plan = [(mutant, tests) for mutant, tests in json.loads(plan_file.read_text())]
    files = sorted({test.partition("::")[0] for _, tests in plan for test in tests})
    return int(pytest.main([*files, *tail], plugins=[_Screen(plan, progress)]))


def _reach(tests: str) -> dict[str, Any]:
    """REACH for the tests digest `tests`, recorded again when they changed."""
    if REACH.exists():
        kept: dict[str, Any] = json.loads(REACH.read_text())
        if kept.get("tests") == tests:
            return kept
    scratch = STAGE / "screen-reach.tmp"
    worker = [sys.executable, __file__, "--screen-worker", "reach", "-", str(scratch)]
    code = subprocess.run(worker, cwd=MUTANTS, stdout=subprocess.DEVNULL).returncode
    if code != 0 or not scratch.exists():
        raise RuntimeError(f"the tests failed without a mutant (exit {code}): fix them before screening")
    stats: dict[str, Any] = {"tests": tests, **json.loads(scratch.read_text())}
    REACH.write_text(json.dumps(stats))
    scratch.unlink()
    return stats


def _read_progress(progress: Path, outcome: dict[str, str], current: str, since: float) -> tuple[str, float]:
    """Take the worker's finished mutants into `outcome`; returns the one it is on and since when."""
    last = current
    for line in progress.read_text().split("\n")[:-1]:  # a line still being written has no newline
        event = json.loads(line)
        if event["event"] == "start":
            last = event["mutant"]
        else:
            outcome[event["mutant"]] = event["event"]
    return (current, since) if last == current else (last, time.monotonic())


def screen(todo: list[str], metas: Metas, tests: str, most: int = SCREEN_MAX_TESTS) -> dict[str, str]:
    """Screen `todo` (see _Screen), restarting the worker past a mutant that hangs; writes the kills
    into `metas` and their .meta files. Returns each screened mutant's outcome."""
    stats = _reach(tests)
    plan = screen_plan(todo, stats, most)
    outcome: dict[str, str] = {}
    plan_file, progress = (
        STAGE / f"screen-plan-{os.getpid()}.json",
        STAGE / f"screen-progress-{os.getpid()}.jsonl",
    )
    try:
        while plan:
            plan_file.write_text(json.dumps(plan))
            progress.write_text("")
            worker = subprocess.Popen(
                [sys.executable, __file__, "--screen-worker", "plan", str(plan_file), str(progress)],
                cwd=MUTANTS,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            current, since = "", time.monotonic()
            try:
                while worker.poll() is None:
                    time.sleep(0.5)
                    current, since = _read_progress(progress, outcome, current, since)
                    if current and current not in outcome:
                        usual = sum(stats["duration_by_test"].get(t, 1.0) for t in dict(plan)[current])
                        if time.monotonic() - since > SCREEN_LIMIT_S + 10 * usual:
                            worker.kill()
            finally:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
            current, since = _read_progress(progress, outcome, current, since)
            if current and current not in outcome:
                outcome[current] = "hung or crashed"
            left = [(mutant, reach) for mutant, reach in plan if mutant not in outcome]
            if len(left) == len(plan):
                raise RuntimeError(
                    f"the screen's worker stopped before its first mutant (exit {worker.returncode})"
                )
            plan = left
    finally:
        # Also when interrupted: the kills so far are kept.
        if progress.exists():
            _read_progress(progress, outcome, "", 0.0)
        plan_file.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
        changed = apply_screen(
            metas, {m: SCREEN_KILLED if o == "killed" else None for m, o in outcome.items()}
        )
        save_metas(metas, changed, MUTANTS)
    return outcome


def read_equivalent(path: Path) -> dict[str, dict[str, str]]:
    """tests/mutation/equivalent.toml: a table per mutant name with the `hash` of its function's
    source (mutmut's, as the store keeps it), the `mutation` for the reader and the `reason`."""
    if not path.exists():
        return {}
    claims: dict[str, dict[str, str]] = tomllib.loads(path.read_text())
    return claims


def function_hash(metas: Metas, key: str) -> str | None:
    for meta in metas.values():
        if key in meta["exit_code_by_key"]:
            hashes: dict[str, str] = meta["hash_by_function_name"]
            return hashes.get(split_key(key)[0])
    return None


def equivalence(
    claims: dict[str, dict[str, str]], status_by_name: dict[str, str], metas: Metas
) -> tuple[dict[str, str], list[str]]:
    """The survivors that `claims` explain (name -> reason), and what is wrong with the others: a
    claim holds only for a survivor whose function is the one it was made for, so an edit of the
    function makes the run ask for the claim to be checked again; a claim on a killed mutant or on
    one that no longer exists is to be removed. A mutant not judged yet is neither."""
    held: dict[str, str] = {}
    problems: list[str] = []
    for name, claim in sorted(claims.items()):
        verdict = status_by_name.get(name)
        if verdict is None:
            problems.append(f"{name}: no such mutant: remove its claim")
        elif (current := function_hash(metas, name)) != claim.get("hash"):
            problems.append(
                f"{name}: its function changed since the claim (hash now {current}): check that the"
                " reason still holds and write the new hash"
            )
        elif verdict in KILLED:
            problems.append(f"{name}: {verdict}, not equivalent: remove its claim")
        elif verdict not in NOT_RUN:
            held[name] = claim.get("reason", "")
    return held, problems


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help="mutant-name globs to run (those without a verdict); all by default"
    )
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=90.0)
    parser.add_argument("--again", action="store_true", help="test the mutants matching the globs again")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="restore the store, save it back and print the score, run nothing",
    )
    parser.add_argument(
        "--screen",
        action="store_true",
        help="instead of mutmut's run, screen the mutants to test in one pytest process: record the kills",
    )
    parser.add_argument(
        "--screen-tests",
        type=int,
        default=SCREEN_MAX_TESTS,
        help="how many of the fastest tests that reach a mutant's function the screen runs",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--screen-worker"]:
        return screen_worker(argv[1], Path(argv[2]), Path(argv[3]))
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)

    stage()
    patterns = pattern_digests()
    generate(options.max_children, patterns)
    metas = load_metas(MUTANTS)
    tests = _tests_digest()
    changed: set[str] = set()
    if TESTS_SEEN.exists() and TESTS_SEEN.read_text() != tests:
        changed |= forget_survivors(metas)
    restored, restored_in = restore(read_store(STORE), metas, tests, patterns)
    changed |= restored_in
    selected = {
        key
        for meta in metas.values()
        for key in meta["exit_code_by_key"]
        if not options.names or any(fnmatch.fnmatch(key, glob) for glob in options.names)
    }
    if options.again:
        for name, meta in metas.items():
            for key in meta["exit_code_by_key"].keys() & selected:
                meta["exit_code_by_key"][key] = None
                changed.add(name)
    save_metas(metas, changed, MUTANTS)
    TESTS_SEEN.write_text(tests)
    todo = sorted(
        k
        for meta in metas.values()
        for k, code in meta["exit_code_by_key"].items()
        if k in selected and code is None
    )
    print(f"restored {restored} verdicts from {STORE.name}; {len(todo)} mutants to test")
    interrupted = False
    try:
        if todo and options.screen and not options.report_only:
            started = time.monotonic()
            outcome = screen(todo, metas, tests, options.screen_tests)
            counts = {o: sum(v == o for v in outcome.values()) for o in sorted(set(outcome.values()))}
            print(f"screened {len(outcome)} of {len(todo)} in {time.monotonic() - started:.0f} s: {counts}")
        elif todo and not options.report_only:
            # Named, mutmut tests a mutant even if it has a verdict; unnamed, every one without.
            mutmut("run", "--max-children", str(options.max_children), *(todo if options.names else []))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        write_store(export(load_metas(MUTANTS), tests, patterns), STORE)

    final = load_metas(MUTANTS)
    status_by_name = {
        k: status(code) for meta in final.values() for k, code in meta["exit_code_by_key"].items()
    }
    judged = {n: s for n, s in status_by_name.items() if s not in NOT_RUN}
    killed = sum(s in KILLED for s in judged.values())
    equivalent, problems = equivalence(read_equivalent(EQUIVALENT), status_by_name, final)
    for name, verdict in sorted(judged.items()):
        if name in equivalent:
            print(f"equivalent: {name}: {equivalent[name]}")
        elif verdict not in KILLED:
            print(f"{verdict}: {name}")
    for problem in problems:
        print(f"{EQUIVALENT.name}: {problem}")
    by_module: dict[str, list[str]] = {}
    for name, verdict in status_by_name.items():
        by_module.setdefault(module_of(name), []).append(verdict)
    for module, statuses in sorted(by_module.items()):
        done = [s for s in statuses if s not in NOT_RUN]
        dead = sum(s in KILLED for s in done)
        share = f"{100.0 * dead / len(done):.1f}" if done else "-"
        print(f"{module}: mutants={len(statuses)} judged={len(done)} killed={dead} score={share}")
    # Equivalent mutants are no bug to catch: the score is over the others.
    counted = len(judged) - len(equivalent)
    score = 100.0 * killed / counted if counted else 0.0
    not_run = len(status_by_name) - len(judged)
    survived = counted - killed
    print(
        f"mutants={len(status_by_name)} judged={len(judged)} killed={killed} equivalent={len(equivalent)}"
        f" survived={survived} not_run={not_run}"
    )
    print(f"mutation_score={score:.1f}")
    if interrupted:
        print(f"interrupted: the verdicts so far are kept in {STORE.name}; run again to go on")
        return 130
    return 0 if score >= options.threshold and not not_run and not problems else 1


if __name__ == "__main__":
    sys.exit(main())

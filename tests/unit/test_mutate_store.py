"""hack/mutate.py's committed verdict store (tests/mutation/verdicts.json): what a fresh `.mutate/`
gets back from it, what it refuses, and that a run writes it back, also when interrupted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))
import mutate

FILE = "src/llmtrain/memory.py"
KILLED, SURVIVED, TIMEOUT = 1, 0, 36
TESTS = "tests-digest"
PATTERNS = {FILE: "patterns-digest"}


def _meta(codes: dict[str, int | None], hashes: dict[str, str]) -> dict[str, Any]:
    """A .meta as mutmut writes it, for mutants named after `memory.py`'s functions."""
    return {
        "exit_code_by_key": {f"llmtrain.memory.{key}": code for key, code in codes.items()},
        "hash_by_function_name": hashes,
        "type_check_error_by_key": {},
        "durations_by_key": {},
        "estimated_durations_by_key": {},
    }


def _codes(metas: mutate.Metas) -> dict[str, int | None]:
    return {k.rpartition(".")[2]: v for k, v in metas[FILE]["exit_code_by_key"].items()}


def _judged() -> mutate.Metas:
    """`plan` with a killed mutant and a survivor, `fits` with one killed by the time limit."""
    codes = {"x_plan__mutmut_1": KILLED, "x_plan__mutmut_2": SURVIVED, "x_fits__mutmut_1": TIMEOUT}
    return {FILE: _meta(codes, {"x_plan": "aaa", "x_fits": "bbb"})}


def _fresh(plan_hash: str = "aaa") -> mutate.Metas:
    """The same mutants just generated in a fresh `.mutate/`: no verdicts."""
    codes: dict[str, int | None] = dict.fromkeys(_codes(_judged()))
    return {FILE: _meta(codes, {"x_plan": plan_hash, "x_fits": "bbb"})}


def _store() -> dict[str, Any]:
    return mutate.export(_judged(), TESTS, PATTERNS)


def test_restores_the_verdicts_of_unchanged_functions() -> None:
    metas = _fresh()
    assert mutate.restore(_store(), metas, TESTS, PATTERNS) == (3, {FILE})
    assert _codes(metas) == _codes(_judged())


def test_a_function_whose_source_changed_is_tested_again() -> None:
    metas = _fresh(plan_hash="ccc")
    assert mutate.restore(_store(), metas, TESTS, PATTERNS)[0] == 1
    assert _codes(metas) == {"x_plan__mutmut_1": None, "x_plan__mutmut_2": None, "x_fits__mutmut_1": TIMEOUT}


def test_a_file_whose_patterns_changed_is_tested_again() -> None:
    metas = _fresh()
    assert mutate.restore(_store(), metas, TESTS, {FILE: "other"}) == (0, set())
    assert set(_codes(metas).values()) == {None}


def test_pattern_digest_follows_the_patterns_that_match_a_line() -> None:
    source = "def f(x):\n    return -1, -1\n"
    matching, other = r"^\s*return -1, -1$", r"^\s*eps=1e-8,$"
    assert mutate.pattern_digest(source, [matching]) == mutate.pattern_digest(source, [matching, other])
    assert mutate.pattern_digest(source, [matching]) != mutate.pattern_digest(source, [])
    assert mutate.pattern_digest(source, [matching]) != mutate.pattern_digest(source, [r"return -1"])


def test_survivors_are_tested_again_when_the_tests_changed() -> None:
    metas = _fresh()
    mutate.restore(_store(), metas, "new-tests", PATTERNS)
    assert _codes(metas) == {
        "x_plan__mutmut_1": KILLED,
        "x_plan__mutmut_2": None,
        "x_fits__mutmut_1": TIMEOUT,
    }
    local = _judged()
    assert mutate.forget_survivors(local) == {FILE}
    assert _codes(local) == _codes(metas)


def test_the_tests_digest_covers_the_tests_and_their_selection(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("x = 1\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.mutmut]\npytest_add_cli_args_test_selection = ["tests/test_x.py"]\n')
    first = mutate._tests_digest(tmp_path)
    (tmp_path / "tests" / "verdicts.json").write_text("{}")
    assert mutate._tests_digest(tmp_path) == first
    pyproject.write_text('[tool.mutmut]\npytest_add_cli_args_test_selection = ["tests/test_y.py"]\n')
    assert mutate._tests_digest(tmp_path) != first
    pyproject.write_text('[tool.mutmut]\npytest_add_cli_args_test_selection = ["tests/test_x.py"]\n')
    (tmp_path / "tests" / "test_x.py").write_text("x = 2\n")
    assert mutate._tests_digest(tmp_path) != first


def test_the_store_round_trips_through_its_text(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.json"
    mutate.write_store(_store(), path)
    text = path.read_text()
    assert mutate.read_store(path) == _store()
    assert mutate.store_text(json.loads(text)) == text
    # One function a line: a diff names the functions whose verdicts changed.
    assert '    "x_plan": {"hash": "aaa", "exit_codes": {"1": 1, "2": 0}}' in text.splitlines()
    metas = _fresh()
    mutate.restore(mutate.read_store(path), metas, TESTS, PATTERNS)
    assert _codes(metas) == _codes(_judged())


def test_unrun_mutants_are_not_stored() -> None:
    metas = _judged()
    metas[FILE]["exit_code_by_key"]["llmtrain.memory.x_plan__mutmut_2"] = None
    metas[FILE]["exit_code_by_key"]["llmtrain.memory.x_fits__mutmut_1"] = 2  # interrupted
    assert mutate.export(metas, TESTS, PATTERNS)["files"][FILE]["functions"] == {
        "x_plan": {"hash": "aaa", "exit_codes": {"1": KILLED}}
    }


@pytest.fixture
def stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """hack/mutate.py's main with its stage in tmp_path and mutmut's generation faked: it writes
    `_fresh()`'s .meta, as mutmut does in a fresh `.mutate/`."""
    mutants = tmp_path / "mutants"
    monkeypatch.setattr(mutate, "STAGE", tmp_path)
    monkeypatch.setattr(mutate, "MUTANTS", mutants)
    monkeypatch.setattr(mutate, "STORE", tmp_path / "verdicts.json")
    monkeypatch.setattr(mutate, "TESTS_SEEN", tmp_path / "tests.sha256")
    monkeypatch.setattr(mutate, "EQUIVALENT", tmp_path / "equivalent.toml")
    monkeypatch.setattr(mutate, "stage", lambda: None)
    monkeypatch.setattr(mutate, "pattern_digests", lambda: PATTERNS)
    monkeypatch.setattr(mutate, "_tests_digest", lambda: TESTS)

    def generate(max_children: int, patterns: dict[str, str]) -> None:
        (mutants / "src/llmtrain").mkdir(parents=True)
        (mutants / f"{FILE}.meta").write_text(json.dumps(_fresh()[FILE]))

    monkeypatch.setattr(mutate, "generate", generate)
    return tmp_path


def test_a_fresh_stage_with_the_store_tests_nothing(
    stage: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate.write_store(_store(), stage / "verdicts.json")

    def mutmut(*args: str) -> None:
        raise AssertionError(f"mutmut {args}")

    monkeypatch.setattr(mutate, "mutmut", mutmut)
    assert mutate.main(["--threshold", "60"]) == 0
    out = capsys.readouterr().out
    assert "restored 3 verdicts" in out
    assert "survived: llmtrain.memory.x_plan__mutmut_2" in out
    assert "llmtrain.memory: mutants=3 judged=3 killed=2 score=66.7" in out
    assert "mutation_score=66.7" in out
    assert mutate.read_store(stage / "verdicts.json") == _store()


def _claim(hash_: str = "aaa") -> str:
    return f'''["llmtrain.memory.x_plan__mutmut_2"]\nhash = "{hash_}"\nreason = "ruled out"\n'''


def test_a_survivor_claimed_equivalent_is_listed_with_its_reason_and_left_out_of_the_score(
    stage: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate.write_store(_store(), stage / "verdicts.json")
    (stage / "equivalent.toml").write_text(_claim())
    assert mutate.main([]) == 0
    out = capsys.readouterr().out
    assert "equivalent: llmtrain.memory.x_plan__mutmut_2: ruled out" in out
    assert "survived: llmtrain.memory.x_plan__mutmut_2" not in out
    assert "mutants=3 judged=3 killed=2 equivalent=1 survived=0 not_run=0" in out
    assert "mutation_score=100.0" in out


def test_a_claim_lapses_when_its_function_changes(
    stage: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate.write_store(_store(), stage / "verdicts.json")
    (stage / "equivalent.toml").write_text(_claim(hash_="an-older-source"))
    assert mutate.main(["--threshold", "60"]) == 1
    out = capsys.readouterr().out
    assert "survived: llmtrain.memory.x_plan__mutmut_2" in out
    assert "x_plan__mutmut_2: its function changed since the claim (hash now aaa)" in out
    assert "mutation_score=66.7" in out


def test_claims_on_killed_unknown_and_unjudged_mutants() -> None:
    metas = _judged()
    metas[FILE]["exit_code_by_key"]["llmtrain.memory.x_plan__mutmut_3"] = None
    statuses = {k: mutate.status(c) for k, c in metas[FILE]["exit_code_by_key"].items()}
    claims = {
        f"llmtrain.memory.{key}": {"hash": hash_, "reason": key}
        for key, hash_ in [
            ("x_plan__mutmut_1", "aaa"),  # killed
            ("x_plan__mutmut_2", "aaa"),  # survived: holds
            ("x_plan__mutmut_3", "aaa"),  # not judged yet: neither
            ("x_plan__mutmut_9", "aaa"),  # gone
            ("x_fits__mutmut_1", "bbb"),  # timed out: killed
        ]
    }
    held, problems = mutate.equivalence(claims, statuses, metas)
    assert held == {"llmtrain.memory.x_plan__mutmut_2": "x_plan__mutmut_2"}
    assert problems == [
        "llmtrain.memory.x_fits__mutmut_1: timeout, not equivalent: remove its claim",
        "llmtrain.memory.x_plan__mutmut_1: killed, not equivalent: remove its claim",
        "llmtrain.memory.x_plan__mutmut_9: no such mutant: remove its claim",
    ]


def test_the_committed_claims_name_a_hash_and_a_reason() -> None:
    claims = mutate.read_equivalent(mutate.EQUIVALENT)
    assert claims, "tests/mutation/equivalent.toml is empty"
    for name, claim in claims.items():
        assert "__mutmut_" in name, name
        assert set(claim) == {"hash", "mutation", "reason"}, name
        assert all(claim.values()), name
    # Each is a survivor in the committed store, of the function it was made for.
    store = mutate.read_store(mutate.STORE)["files"]
    for name, claim in claims.items():
        module = mutate.module_of(name)
        function, number = mutate.split_key(name)
        stored = store[f"src/{module.replace('.', '/')}.py"]["functions"][function]
        assert (stored["hash"], stored["exit_codes"].get(number)) == (claim["hash"], SURVIVED), name


def test_an_interrupted_run_stores_the_verdicts_so_far_and_reports_them(
    stage: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def mutmut(*args: str) -> None:
        assert args == ("run", "--max-children", "1", "llmtrain.memory.x_plan__mutmut_1")
        meta = stage / "mutants" / f"{FILE}.meta"
        data = json.loads(meta.read_text())
        data["exit_code_by_key"]["llmtrain.memory.x_plan__mutmut_1"] = KILLED
        meta.write_text(json.dumps(data))
        raise KeyboardInterrupt

    monkeypatch.setattr(mutate, "mutmut", mutmut)
    assert mutate.main(["llmtrain.memory.x_plan__mutmut_1"]) == 130
    out = capsys.readouterr().out
    assert (
        "mutants=3 judged=1 killed=1 equivalent=0 survived=0 not_run=2" in out
        and "interrupted: the verdicts so far" in out
    )
    stored = mutate.read_store(stage / "verdicts.json")["files"][FILE]["functions"]
    assert stored == {"x_plan": {"hash": "aaa", "exit_codes": {"1": KILLED}}}


def test_a_screen_takes_a_kill_only_when_the_test_passes_again_without_the_mutant() -> None:
    assert mutate.screen_verdict(failed_with_mutant=True, passed_without=True) == KILLED
    # Failing without the mutant too: state a previous mutant left behind, not this one's kill.
    assert mutate.screen_verdict(failed_with_mutant=True, passed_without=False) is None
    # Not killed in one process is no survivor: mutmut's own run decides it.
    assert mutate.screen_verdict(failed_with_mutant=False, passed_without=True) is None


def test_a_screen_writes_kills_into_unjudged_mutants_only() -> None:
    metas = _judged()
    metas[FILE]["exit_code_by_key"]["llmtrain.memory.x_plan__mutmut_3"] = None
    metas[FILE]["exit_code_by_key"]["llmtrain.memory.x_plan__mutmut_4"] = None
    verdicts: dict[str, int | None] = {
        "llmtrain.memory.x_plan__mutmut_2": KILLED,  # mutmut's survivor stays one
        "llmtrain.memory.x_plan__mutmut_3": KILLED,
        "llmtrain.memory.x_plan__mutmut_4": None,
    }
    assert mutate.apply_screen(metas, verdicts) == {FILE}
    assert _codes(metas) == {
        "x_plan__mutmut_1": KILLED,
        "x_plan__mutmut_2": SURVIVED,
        "x_fits__mutmut_1": TIMEOUT,
        "x_plan__mutmut_3": KILLED,
        "x_plan__mutmut_4": None,
    }
    assert mutate.apply_screen(metas, {"llmtrain.memory.x_plan__mutmut_4": None}) == set()


def test_a_screen_runs_the_tests_that_reach_a_mutants_function_fastest_first() -> None:
    stats = {
        "tests_by_mangled_function_name": {"llmtrain.memory.x_plan": ["t::slow", "t::fast", "t::slow"]},
        "duration_by_test": {"t::slow": 2.0, "t::fast": 0.1},
    }
    todo = ["llmtrain.memory.x_plan__mutmut_1", "llmtrain.memory.x_fits__mutmut_1"]
    assert mutate.screen_plan(todo, stats) == [("llmtrain.memory.x_plan__mutmut_1", ["t::fast", "t::slow"])]
    assert mutate.screen_plan(todo, stats, most=1) == [("llmtrain.memory.x_plan__mutmut_1", ["t::fast"])]

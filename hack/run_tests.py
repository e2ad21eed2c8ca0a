"""`make test`: every tier, in three pytest processes side by side.

Most of a tier's time is waiting (controllers converging, pods starting, Ray clusters coming up,
images loading), so on a 2-core CI machine lanes overlap that waiting: one runs the real cluster
tier beside the fast tiers (the trainer's unit tests among them), one the trainer's Ray tests
beside the real-pod tier, and the third the kind end-to-end run (tests/e2e/test_kind.py, about
6 minutes alone and 10 beside the other lanes: mostly the 3.3 GB image import and one training
job), then the trainer's unit tests and some of its Ray tests, so that the three end at about the
same time (on a machine that never built the trainer image the kind run goes last: it waits for that
build). Their clusters, Ray instances and ports are independent; each lane has its own pytest
session and fixtures. Each lane's output goes to a
log; a heartbeat line shows they are alive, and each log's summary (the whole log when a lane
fails) is printed at the end. The exit status fails if any lane does.

`make test` starts the lanes while its background builds (the cluster's binaries, the images,
kind's node image) may still run: a test waits for the build it needs where it uses it
(tests/support/builds.py), and each lane's log ends with how long its tests waited. Each lane
runs its paths in the order given.

    python hack/run_tests.py [PYTEST ARGS...]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import images

REPO_ROOT = Path(__file__).resolve().parents[1]
LANES = {
    "cluster": [
        "tests/unit",
        "tests/chart",
        "tests/e2e",
        "tests/cluster",
        # Last: on a cold machine the image build (in the background) ends after the tools build.
        "tests/images",
    ],
    "trainer+pods": ["tests/trainer/ray", "tests/pods"],
    # The kind run first: its image import and the node's start are disk-bound, and the other
    # lanes start with CPU-bound tests. Then tests that need neither cluster, so that the three
    # lanes end together (a file named here leaves its folder's lane). On a machine that never
    # built the trainer image the kind run goes last instead (kind_lane_order()).
    "kind": [
        "tests/e2e/test_kind.py",
        "tests/trainer/unit",
        "tests/trainer/ray/test_resume.py",
        "tests/trainer/ray/test_checkpoint_fallback.py",
        "tests/trainer/ray/test_run_identity.py",
    ],
}
HEARTBEAT_SECONDS = 120
# Waits for the images, which a machine that never built them makes in the background for about
# 40 minutes (the trainer's torch layers): the lane's other tests run first there.
KIND_RUN = "tests/e2e/test_kind.py"


def images_never_built(images_dir: Path) -> bool:
    """No trainer image archive of any key: the build starts from nothing (a code change since the
    last build only rebuilds the top layers, a minute or two)."""
    return not any(images_dir.glob(images.archive_path("trainer", key="*").name))


def kind_lane_order(paths: list[str], cold: bool) -> list[str]:
    """The kind lane's paths, with the kind run moved last on a cold machine, so that its wait for
    the images overlaps the lane's other tests instead of preceding them."""
    return [p for p in paths if p != KIND_RUN] + [KIND_RUN] if cold else paths


def test_files() -> set[Path]:
    return {f for f in (REPO_ROOT / "tests").rglob("test_*.py") if "support" not in f.parts}


def named_files() -> dict[Path, str]:
    """Test files a lane names one by one, with that lane."""
    return {
        REPO_ROOT / path: lane
        for lane, paths in LANES.items()
        for path in paths
        if (REPO_ROOT / path).is_file()
    }


def lanes_of(test_file: Path) -> list[str]:
    """The lanes that run `test_file`: the one naming it, else those naming a folder above it."""
    named = named_files()
    if test_file in named:
        return [named[test_file]]
    return [
        lane
        for lane, paths in LANES.items()
        for path in paths
        if (REPO_ROOT / path).is_dir() and (REPO_ROOT / path) in test_file.parents
    ]


def unlaned() -> list[str]:
    """Problems with LANES: each test file must be in exactly one lane."""
    problems: list[str] = []
    for f in sorted(test_files()):
        lanes = lanes_of(f)
        if len(lanes) != 1:
            where = " and ".join(lanes) or "no lane"
            problems.append(f"{f.relative_to(REPO_ROOT)} is in {where}")
    return problems


def pytest_paths(lane: str) -> list[str]:
    """The lane's paths for pytest, minus the files another lane names inside its folders."""
    ignores = [
        f"--ignore={f.relative_to(REPO_ROOT)}"
        for f, other in named_files().items()
        if other != lane and any((REPO_ROOT / p).is_dir() and REPO_ROOT / p in f.parents for p in LANES[lane])
    ]
    paths = LANES[lane]
    if lane == "kind":
        paths = kind_lane_order(paths, images_never_built(images.images_dir()))
    return [*ignores, *paths]


def main(argv: list[str]) -> int:
    if problems := unlaned():
        print("run_tests.py: " + "; ".join(problems), file=sys.stderr)
        return 2
    logs = REPO_ROOT / ".venv" / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    for lane in LANES:
        log = logs / f"{lane.replace('+', '-')}.log"
        out = log.open("wb")
        # The slowest tests of each lane end its log: what to move when the lanes drift apart.
        cmd = [sys.executable, "-m", "pytest", "--durations=30", *argv, *pytest_paths(lane)]
        print(f"[{lane}] {' '.join(cmd[1:])} > {log.relative_to(REPO_ROOT)}", flush=True)
        running[lane] = (subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT), log)
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    last_beat = time.monotonic()
    while len(codes) < len(running):
        for lane, (proc, _) in running.items():
            if lane not in codes and proc.poll() is not None:
                codes[lane], took[lane] = proc.returncode, time.monotonic() - started
                print(f"[{lane}] exit {proc.returncode} after {took[lane] / 60:.1f} min", flush=True)
        if time.monotonic() - last_beat > HEARTBEAT_SECONDS:
            last_beat = time.monotonic()
            busy = [lane for lane in running if lane not in codes]
            print(f"... {(last_beat - started) / 60:.0f} min, running: {', '.join(busy)}", flush=True)
        time.sleep(1)
    for lane, (_, log) in running.items():
        lines = log.read_text(errors="replace").splitlines()
        shown = lines if codes[lane] != 0 else lines[-15:]
        print(f"\n===== [{lane}] exit {codes[lane]}, {took[lane] / 60:.1f} min ({log}) =====")
        print("\n".join(shown))
    print(f"\nall lanes done in {(time.monotonic() - started) / 60:.1f} min")
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

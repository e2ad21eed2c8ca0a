"""The RayJob's driver process: it imports only what the driver runs, and it exits without the
interpreter's final teardown.

Every job's driver (`python -m llmtrain_trainer.main`) imports the entrypoint, runs preflight and
builds the TorchTrainer before Ray Train starts a single worker; on a 2-CPU head each heavy package
it imports there costs seconds, and the workers import their training stack again anyway. The
driver needs torch and transformers (preflight builds the model on the meta device and loads the
tokenizer) and ray.train.torch; this pins the worker-only modules it must not import, for every
trainer type, in a fresh interpreter as the RayJob starts it. After `main` returns, the
interpreter's teardown of those modules would cost seconds more of the job (`exit_now`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.trainer import REPO

WORKER_ONLY = (
    # third-party packages only the workers (or only one mode on the workers) use
    "datasets",
    "peft",
    "deepspeed",
    "transformers.trainer",
    "ray.train.huggingface",
    # the workers' side of the trainer: lifecycle, checkpoint files, strategies, the modes' code
    "llmtrain_trainer.lifecycle",
    "llmtrain_trainer.checkpoint",
    "llmtrain_trainer.strategies.base",
    "llmtrain_trainer.export",
    "llmtrain_trainer.loss",
    "llmtrain_trainer.modes.builtin",
    "llmtrain_trainer.modes.huggingface",
    "llmtrain_trainer.modes.custom",
)

DRIVER = """
import json, sys
from pathlib import Path
watched = json.loads(sys.argv[1])
storage, code = Path(sys.argv[2]), sys.argv[3]
import llmtrain_trainer.main as driver
loaded = {"import": [m for m in watched if m in sys.modules]}
from tests.support.trainer import tiny_config
trainers = {
    "builtin": {"type": "builtin"},
    "huggingface": {"type": "huggingface"},  # pass-through args import TrainingArguments, and so peft
    "custom": {"type": "custom", "custom": {"function": "user_train:train", "path": code}},
}
for name, trainer in trainers.items():
    config = tiny_config(storage, name, trainer=trainer, strategy={"type": "ddp"})
    driver.check(config)
    driver.build_trainer(config)
    loaded[name] = [m for m in watched if m in sys.modules]
print(json.dumps(loaded))
"""


def test_the_driver_imports_no_worker_only_module(tmp_path: Path) -> None:
    """Import, preflight and build the trainer for each trainer type, as the driver does before
    `fit`: none of the worker-only modules is imported (a top-level import of one, in main.py or
    in a module preflight reaches, brings it back)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "user_train.py").write_text("def train(context):\n    pass\n")
    process = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(WORKER_ONLY), str(tmp_path / "runs"), str(code)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    loaded = json.loads(process.stdout.strip().splitlines()[-1])
    assert loaded == {"import": [], "builtin": [], "huggingface": [], "custom": []}


EXITING = """
import atexit, threading, time
from llmtrain_trainer.main import exit_now

class Teardown:
    def __del__(self):
        print("torn down", flush=True)

kept = Teardown()  # freed only by the interpreter's final teardown
atexit.register(lambda: print("atexit ran"))

def late():
    time.sleep(0.5)
    print("thread finished")

threading.Thread(target=late).start()
print("buffered", end="")
exit_now(3)
"""


def test_the_driver_exits_with_its_code_after_threads_and_atexit_without_teardown() -> None:
    """What an exiting interpreter does before its teardown still happens, in its order: non-daemon
    threads end, the atexit handlers run (Ray's shutdown among them), buffered output is written;
    the teardown itself (freeing every module, the `__del__` of what they hold) is skipped."""
    process = subprocess.run(
        [sys.executable, "-c", EXITING], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert (process.returncode, process.stderr) == (3, "")
    assert process.stdout == "bufferedthread finished\natexit ran\n"

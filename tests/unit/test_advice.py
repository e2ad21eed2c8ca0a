"""What `llmtrain validate`, `render` and `run` say besides valid or not (issue #24's error messages):
an acceleratorType no node carries, the memory estimate of a job that fits, a Secret beside the job
in one file (skipped alike by all three), and a GPU spec run without --gpu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import advice, cli, memory
from llmtrain.accelerators import GKE_ACCELERATOR_LABEL, GPU_PRODUCT_LABEL, KNOWN_ACCELERATORS
from llmtrain.api.spec import ResourcesSpec
from llmtrain.api.validation import parse_job
from llmtrain.cli import main

from tests.support.jobs import load_example, minimal_job, with_path

SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}, "stringData": {"t": "x"}}


def _write(tmp_path: Path, *docs: dict[str, Any], name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


# ---- acceleratorType ---------------------------------------------------------------------------
def test_an_accelerator_type_no_labeller_writes_is_warned_with_the_known_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path, with_path(load_example("llama3-8b-fsdp.yaml"), "spec.resources.acceleratorType", "H100")
    )
    for command in ("validate", "render"):
        assert main([command, str(path)]) == 0  # a warning: a new GPU may carry a value not listed
        err = capsys.readouterr().err
        assert f"{path}: llama3-8b-fsdp: warning: resources.acceleratorType 'H100'" in err, command
        assert "did you mean NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe or NVIDIA-H100-NVL?" in err
        assert all(value in err for value in KNOWN_ACCELERATORS[GPU_PRODUCT_LABEL])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (GPU_PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
        (GKE_ACCELERATOR_LABEL, "nvidia-h100-80gb"),
        ("example.com/accelerator", "H100"),  # a labeller of its own: its values are not judged
    ],
)
def test_known_values_and_unknown_label_keys_pass_without_a_warning(key: str, value: str) -> None:
    resources = ResourcesSpec(accelerator_label_key=key, accelerator_type=value)
    assert advice.accelerator_warning(resources) is None


def test_a_gke_value_on_the_gfd_key_is_warned() -> None:
    warning = advice.accelerator_warning(ResourcesSpec(accelerator_type="nvidia-h100-80gb"))
    assert warning is not None and "NVIDIA-H100-80GB-HBM3" in warning


@pytest.mark.parametrize(
    ("key", "value", "gib"),
    [(k, v, g) for k, values in KNOWN_ACCELERATORS.items() for v, g in values.items()],
)
def test_every_known_value_gives_the_memory_check_its_device_memory(key: str, value: str, gib: int) -> None:
    """One table for both: a value validate does not warn about is one the memory check can size."""
    resources = ResourcesSpec(accelerator_label_key=key, accelerator_type=value, gpus_per_worker=8)
    assert memory.device_memory_bytes(resources) == gib * memory.GIB


# ---- the memory estimate of a job that fits ------------------------------------------------------
def test_validate_prints_the_estimate_of_a_job_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = load_example("tiny-cpu.yaml")
    path = _write(tmp_path, document)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    est = memory.estimate(memory.Plan.of_job(parse_job(document).spec))
    assert est is not None and est.peak is not None
    assert (
        f"{path}: tiny-cpu: memory: fits: estimated peak {memory.human_bytes(est.peak)} per worker "
        "(resources.memory) of 2.0 GiB (parameters" in out
    )
    assert out.strip().splitlines()[-1] == "1 file(s) valid"


def test_validate_prints_the_per_gpu_estimate_and_says_when_the_capacity_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = _write(tmp_path, load_example("llama3-8b-fsdp.yaml"), name="known.yaml")
    unknown = _write(
        tmp_path,
        with_path(load_example("llama3-8b-fsdp.yaml"), "spec.resources.acceleratorType", "some-accelerator"),
        name="unknown.yaml",
    )
    by_name = _write(tmp_path, minimal_job(model={"name": "org/my-model"}), name="by-name.yaml")
    assert main(["validate", str(known), str(unknown), str(by_name)]) == 0
    out = capsys.readouterr().out
    states = "parameters, gradients and optimizer states 14.9 GiB per GPU"
    assert f"known.yaml: llama3-8b-fsdp: memory: fits: {states} of 80.0 GiB" in out
    assert f"unknown.yaml: llama3-8b-fsdp: memory: {states}; the fit is not checked" in out
    assert "by-name.yaml: demo: memory: not estimated before start-up" in out


# ---- a Secret and a job in one file -------------------------------------------------------------
def test_validate_render_and_run_skip_a_secret_beside_the_job_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmtrain_trainer.local import load_job_config

    path = _write(tmp_path, SECRET, load_example("tiny-cpu.yaml"))
    note = f"{path}: note: skipped document 1 of 2 (Secret 'hf-token'): not an LLMTrainingJob"

    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert note in err and f"{path} (document 2 of 2): tiny-cpu: memory: fits" in out

    assert main(["render", str(path)]) == 0
    out, err = capsys.readouterr()
    assert note in err
    assert [d["kind"] for d in yaml.safe_load_all(out) if d][-1] == "RayJob"
    assert "Secret" not in out

    # run: the CLI says what it skips, and the runner trains the job document (not the Secret).
    loaded = []

    def runner(job_file: Path, runs_root: Path, use_gpu: bool, fresh: bool) -> int:
        loaded.append(load_job_config(job_file, tmp_path / "runs", use_gpu))
        return 0

    monkeypatch.setattr(cli, "local_trainer", lambda: runner)
    assert main(["run", str(path)]) == 0
    assert note in capsys.readouterr().err
    assert loaded[0].job.name == "tiny-cpu"


def test_a_mistyped_job_is_not_skipped_and_run_takes_one_job_per_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmtrain_trainer.local import InvalidJobFile, load_job_config

    typo = {**minimal_job("typo"), "kind": "LLMTrainingJobs"}  # llmtrain's group: a job, refused
    path = _write(tmp_path, SECRET, typo)
    assert main(["validate", str(path)]) == 1
    assert f"{path} (document 2 of 2): .kind:" in capsys.readouterr().err

    only_secret = _write(tmp_path, SECRET, name="secret.yaml")
    assert main(["validate", str(only_secret)]) == 1
    assert main(["render", str(only_secret)]) == 1
    assert "no LLMTrainingJob among its 1 document(s)" in capsys.readouterr().err

    two = _write(tmp_path, minimal_job("a"), SECRET, minimal_job("b"), name="two.yaml")
    assert main(["validate", str(two)]) == 0
    assert main(["render", str(two)]) == 0
    with pytest.raises(InvalidJobFile, match=r"holds 2 LLMTrainingJobs \(documents 1, 3 of 3\)"):
        load_job_config(two, tmp_path / "runs", use_gpu=False)


# ---- llmtrain run on a GPU spec without --gpu ---------------------------------------------------
@pytest.mark.parametrize(("gpus", "flags", "warned"), [(8, [], True), (8, ["--gpu"], False), (0, [], False)])
def test_run_says_a_gpu_spec_trains_on_the_cpu_before_the_runner_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    gpus: int,
    flags: list[str],
    warned: bool,
) -> None:
    path = _write(tmp_path, minimal_job("gpu", resources={"gpusPerWorker": gpus, "workers": 2}))
    said_before_start: list[str] = []

    def runner(job_file: Path, runs_root: Path, use_gpu: bool, fresh: bool) -> int:
        said_before_start.append(capsys.readouterr().err)  # the runner starts Ray first thing
        assert use_gpu == bool(flags)
        return 0

    monkeypatch.setattr(cli, "local_trainer", lambda: runner)
    assert main(["run", str(path), *flags]) == 0
    warning = (
        f"{path}: warning: this job asks for 8 GPU(s) per worker (resources.gpusPerWorker), but "
        "llmtrain run trains on the CPU unless given --gpu: training on the CPU with 2 process(es)"
    )
    assert (warning in said_before_start[0]) is warned, said_before_start[0]


def test_the_secrets_a_job_reads_are_checked_against_its_namespaces_list() -> None:
    """`llmtrain submit` refuses, before applying, a job whose pods read a Secret the namespace
    does not allow: the containment policy would refuse its Ray cluster after the job existed."""
    from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION
    from llmtrain.render import render

    doc = load_example("llama3-8b-fsdp.yaml")
    doc = with_path(
        doc,
        "spec.network.env",
        [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}],
    )
    token = doc["spec"]["model"]["hfTokenSecretRef"]["name"]
    wanted = advice.secrets_reaching_pods(render(parse_job(doc)))
    assert wanted == sorted({token, "wandb"})
    assert advice.secrets_reaching_pods(render(parse_job(minimal_job()))) == []

    def refusal(listed: str | None) -> str | None:
        annotations = None if listed is None else {ALLOWED_SECRETS_ANNOTATION: listed}
        return advice.secrets_refusal("team-a", wanted, annotations)

    assert refusal("*") is None
    assert refusal(f"wandb, {token}") is None
    unlisted = refusal(None)
    assert unlisted is not None
    assert f"Secret(s) {token}, wandb, which namespace team-a does not list" in unlisted
    assert "(now: none)" in unlisted
    assert unlisted.endswith(
        f"kubectl annotate namespace team-a {ALLOWED_SECRETS_ANNOTATION}={token},wandb --overwrite"
    )
    partly = refusal("wandb")
    assert partly is not None and f"Secret(s) {token}, which" in partly and "(now: wandb)" in partly
    assert partly.endswith(f"{ALLOWED_SECRETS_ANNOTATION}=wandb,{token} --overwrite")

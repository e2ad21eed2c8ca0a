"""What the CLI tells a user about a job file besides valid or not: pure functions, cli.py prints.

- Which documents of a file are LLMTrainingJobs. `kubectl apply -f` takes a Secret and a job in one
  file, so `validate`, `render` and `run` all skip the other documents alike, each with a note.
- An `acceleratorType` no known labeller writes: the node selector would match no node.
- The memory estimate of a job that passes (memory.summary).
- A GPU job run locally without `--gpu`, which trains on the CPU.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrain.accelerators import KNOWN_ACCELERATORS, LABELLERS
from llmtrain.api.spec import LLMTrainingJobSpec, ResourcesSpec
from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION, API_GROUP, KIND


@dataclass(frozen=True)
class Document:
    """One document of a YAML file, with its place in the file for messages."""

    body: Any
    index: int  # 1-based
    total: int

    def where(self, path: Path | str) -> str:
        """The file, and the document when the file holds several."""
        return str(path) if self.total == 1 else f"{path} (document {self.index} of {self.total})"


def is_job(body: Any) -> bool:
    """Meant as an LLMTrainingJob: its kind or its apiVersion's group says so. A document that
    names neither (no kind, not a mapping) counts as a job too, so validation says what is wrong
    with it instead of skipping it."""
    if not isinstance(body, dict):
        return True
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind == KIND or (isinstance(api_version, str) and api_version.split("/")[0] == API_GROUP):
        return True
    return not (isinstance(kind, str) and kind)


def _describe(body: dict[str, Any]) -> str:
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f"{body.get('kind')} {name!r}" if isinstance(name, str) else str(body.get("kind"))


def job_documents(bodies: list[Any]) -> tuple[list[Document], list[str]]:
    """The file's LLMTrainingJob documents, and one note for each other document it skips."""
    documents = [Document(body, i, len(bodies)) for i, body in enumerate(bodies, start=1)]
    notes = [
        f"skipped document {d.index} of {d.total} ({_describe(d.body)}): not an {KIND}"
        for d in documents
        if not is_job(d.body)
    ]
    return [d for d in documents if is_job(d.body)], notes


class NotOneJob(ValueError):
    """`llmtrain run` trains one job per file: the file holds none or several."""


def the_job(bodies: list[Any], verb: str = "llmtrain run trains") -> Document:
    """The one LLMTrainingJob document of a file that `llmtrain run` trains (the file is the local
    run's identity: the same file resumes, so one file holds one run)."""
    jobs, _ = job_documents(bodies)
    if len(jobs) == 1:
        return jobs[0]
    if not jobs:
        raise NotOneJob(f"holds no {KIND} (of {len(bodies)} document(s))")
    places = ", ".join(str(d.index) for d in jobs)
    raise NotOneJob(
        f"holds {len(jobs)} {KIND}s (documents {places} of {len(bodies)}); {verb} one: "
        "put each job in a file of its own"
    )


def accelerator_warning(resources: ResourcesSpec) -> str | None:
    """A warning when acceleratorType is not a value the labeller of acceleratorLabelKey writes
    (None for a key whose labeller is unknown: its values cannot be judged)."""
    value, key = resources.accelerator_type, resources.accelerator_label_key
    known = list(KNOWN_ACCELERATORS.get(key, {}))
    if value is None or not known or value in known:
        return None
    similar = [v for v in known if value.lower() in v.lower()] or difflib.get_close_matches(
        value, known, n=3, cutoff=0.6
    )
    hint = f"did you mean {_one_of(similar)}? " if similar else ""
    return (
        f"resources.acceleratorType {value!r} is not a value {LABELLERS[key]} writes to {key}: the "
        f"worker pods' node selector {key}={value} may match no node, and the job would wait "
        f"forever; {hint}known values: {', '.join(known)} (see yours with `kubectl get nodes -L {key}`)"
    )


def _one_of(values: list[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def cpu_fallback_note(spec: LLMTrainingJobSpec, use_gpu: bool) -> str | None:
    """`llmtrain run` trains on the CPU unless given --gpu: say so when the spec asks for GPUs."""
    gpus = spec.resources.gpus_per_worker
    if use_gpu or gpus == 0:
        return None
    return (
        f"this job asks for {gpus} GPU(s) per worker (resources.gpusPerWorker), but llmtrain run "
        f"trains on the CPU unless given --gpu: training on the CPU with {spec.resources.workers} "
        "process(es); pass --gpu to train on this machine's GPUs"
    )


def run_notes(bodies: list[Any], use_gpu: bool) -> list[str]:
    """What `llmtrain run` says before it starts: the documents it skips, and a GPU spec it is
    about to train on the CPU. Silent on a file without one valid job: the runner refuses it."""
    _, notes = job_documents(bodies)
    lines = [f"note: {note}" for note in notes]
    try:
        job = parse_job(the_job(bodies).body)
    except (NotOneJob, InvalidJob):
        return lines
    cpu = cpu_fallback_note(job.spec, use_gpu)
    return [*lines, f"warning: {cpu}"] if cpu else lines


def _pod_specs(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayjob["spec"].get("rayClusterSpec") or {}
    templates = [cluster.get("headGroupSpec", {}).get("template", {})]
    templates += [g.get("template", {}) for g in cluster.get("workerGroupSpecs") or []]
    templates.append(rayjob["spec"].get("submitterPodTemplate") or {})
    return [t.get("spec") or {} for t in templates]


def secrets_reaching_pods(objects: list[dict[str, Any]]) -> list[str]:
    """The Secrets whose data the job's Ray pods would read, in the ways the chart's containment
    policy judges: secret, projected and CSI volumes, env secretKeyRef and envFrom. Image pull
    Secrets are not among them (only the kubelet reads those)."""
    names: list[str] = []
    for rayjob in (o for o in objects if o.get("kind") == "RayJob"):
        for pod in _pod_specs(rayjob):
            for volume in pod.get("volumes") or []:
                names.append((volume.get("secret") or {}).get("secretName", ""))
                names += [
                    (s.get("secret") or {}).get("name", "")
                    for s in (volume.get("projected") or {}).get("sources") or []
                ]
                names.append(((volume.get("csi") or {}).get("nodePublishSecretRef") or {}).get("name", ""))
            for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                for env in container.get("env") or []:
                    names.append(((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name", ""))
                names += [(f.get("secretRef") or {}).get("name", "") for f in container.get("envFrom") or []]
    return sorted({n for n in names if n})


def secrets_refusal(namespace: str, wanted: list[str], annotations: dict[str, str] | None) -> str | None:
    """Why the chart's containment policy will refuse the job's Ray cluster, and the fix; None when
    the namespace lists every Secret the pods read (or `*`). The operator would create the job and
    then fail to create its RayJob: saying so before anything is applied saves the round trip."""
    listed = (annotations or {}).get(ALLOWED_SECRETS_ANNOTATION)
    allowed = [s.strip() for s in listed.split(",")] if listed is not None else []
    missing = [s for s in wanted if s not in allowed]
    if "*" in allowed or not missing:
        return None
    now = ", ".join(a for a in allowed if a) or "none"
    value = ",".join(dict.fromkeys([*(a for a in allowed if a), *missing]))
    return (
        f"the job's pods read Secret(s) {', '.join(missing)}, which namespace {namespace} does not list in "
        f"its annotation {ALLOWED_SECRETS_ANNOTATION} (now: {now}); llmtrain's containment policy would "
        f"refuse its Ray cluster. A namespace admin allows them with: kubectl annotate namespace "
        f"{namespace} {ALLOWED_SECRETS_ANNOTATION}={value} --overwrite"
    )

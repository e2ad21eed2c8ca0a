"""What the cluster verbs (`llmtrain status | watch | list | logs`) print, from plain objects.

Pure functions over the dicts the API server returns, so every line a user reads is unit-tested
without a cluster; jobs_cli.py does the I/O. The trainer's console bar (`llmtrain run`) formats
durations with `format_duration` too, so a run reads the same on a laptop and on a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from llmtrain.constants import RFC3339_FORMAT

TERMINAL_PHASES = ("Succeeded", "Failed")
BAR_WIDTH = 24
LABEL_WIDTH = 14  # `Ray cluster:` and two spaces: every status reads in the same columns

Obj = Mapping[str, Any]


class PodNotFound(LookupError):
    """No pod of the asked role (yet, or any more); the message says which and what exists."""


def format_duration(seconds: float) -> str:
    """`1:02:03` or `2:03`: a clock, not a unit soup, as progress bars show time."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def age(timestamp: str | None, now: datetime) -> str:
    """kubectl's AGE: the largest unit or two (`45s`, `3m12s`, `5h4m`, `2d3h`)."""
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, RFC3339_FORMAT).replace(tzinfo=UTC)
    seconds = max(0, int((now - then).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs and minutes < 10 else f"{minutes}m"
    return f"{secs}s"


def _status(job: Obj) -> Obj:
    status: Obj = job.get("status") or {}
    return status


def phase(job: Obj) -> str:
    return str(_status(job).get("phase") or "Pending")


def is_terminal(job: Obj) -> bool:
    return phase(job) in TERMINAL_PHASES


def exit_code(job: Obj) -> int:
    """0 when the job succeeded, 1 when it failed: what `submit` and `watch` exit with."""
    return 0 if phase(job) == "Succeeded" else 1


def progress_stats(progress: Obj) -> str:
    """`loss 1.2345 · 5,322 tok/s · ETA 1:00:00`: the figures beside the bar, those known."""
    parts = []
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4f}")
    if progress.get("tokensPerSecond"):
        parts.append(f"{progress['tokensPerSecond']:,.0f} tok/s")
    if progress.get("etaSeconds") is not None:
        parts.append(f"ETA {format_duration(progress['etaSeconds'])}")
    return " · ".join(parts)


def progress_line(job: Obj, width: int = BAR_WIDTH) -> str:
    """One line of live progress: phase, a bar with step/total and percent, then the figures.

    Before the trainer's first report there is no bar, only the phase and why it is in it."""
    status = _status(job)
    progress: Obj = status.get("progress") or {}
    step, total = progress.get("step"), progress.get("totalSteps")
    head = f"{phase(job):<12}"
    if step is None or not total:
        message = status.get("message") or ""
        return f"{head} {message}".rstrip()
    done = min(1.0, step / total)
    filled = round(done * width)
    bar = "#" * filled + "." * (width - filled)
    stats = progress_stats(progress)
    return f"{head} [{bar}] {step}/{total} {done:4.0%}" + (f" · {stats}" if stats else "")


def status_text(job: Obj, now: datetime) -> str:
    """`llmtrain status NAME`: the phase and why, progress, checkpoint, root cause, conditions."""
    meta: Obj = job.get("metadata") or {}
    status = _status(job)
    progress: Obj = status.get("progress") or {}
    rows: list[tuple[str, str]] = [
        ("Name", str(meta.get("name", ""))),
        ("Namespace", str(meta.get("namespace", ""))),
        ("Phase", phase(job)),
        ("Message", str(status.get("message") or "")),
    ]
    step, total = progress.get("step"), progress.get("totalSteps")
    if step is not None:
        share = f" ({min(1.0, step / total):.0%})" if total else ""
        stats = progress_stats(progress)
        rows.append(("Progress", f"{step}/{total or '?'}{share}" + (f" · {stats}" if stats else "")))
    checkpoint: Obj = progress.get("lastCheckpoint") or {}
    if checkpoint:
        rows.append(("Checkpoint", f"step {checkpoint.get('step')}: {checkpoint.get('path')}"))
    if progress.get("exportedTo"):  # checkpoint.exportTo: where the finished model now is
        rows.append(("Exported to", str(progress["exportedTo"])))
    if progress.get("error"):
        rows.append(("Error", str(progress["error"])))
    if progress.get("updatedAt"):
        rows.append(("Reported", f"{age(progress['updatedAt'], now)} ago"))
    for label, key in (
        ("RayJob", "rayJobName"),
        ("Ray cluster", "rayClusterName"),
        ("Dashboard", "dashboardURL"),
        ("Retries", "retries"),
    ):
        if status.get(key) not in (None, ""):
            rows.append((label, str(status[key])))
    lines = [f"{label + ':':<{LABEL_WIDTH}}{value}".rstrip() for label, value in rows]
    conditions: Sequence[Obj] = status.get("conditions") or []
    if conditions:
        lines.append("Conditions:")
        table = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]] + [
            [
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason", "")),
                age(c.get("lastTransitionTime"), now),
                str(c.get("message", "")),
            ]
            for c in conditions
        ]
        lines.extend("  " + line for line in columns(table))
    return "\n".join(lines) + "\n"


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as kubectl prints them: left-aligned cells, three spaces apart, no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def list_table(jobs: Sequence[Obj], now: datetime, all_namespaces: bool = False) -> str:
    """`llmtrain list`: `kubectl get llmtj`'s columns plus throughput and ETA, sorted by name."""
    header = ["NAME", "PHASE", "PROGRESS", "LOSS", "TOKENS/S", "ETA", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows: list[list[str]] = [header]
    ordered = sorted(jobs, key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
    for job in ordered:
        meta: Obj = job["metadata"]
        progress: Obj = _status(job).get("progress") or {}
        step, total = progress.get("step"), progress.get("totalSteps")
        row = [
            meta["name"],
            phase(job),
            f"{step}/{total}" if step is not None and total else "",
            f"{progress['loss']:.4f}" if progress.get("loss") is not None else "",
            f"{progress['tokensPerSecond']:,.0f}" if progress.get("tokensPerSecond") else "",
            format_duration(progress["etaSeconds"]) if progress.get("etaSeconds") is not None else "",
            age(meta.get("creationTimestamp"), now),
        ]
        if all_namespaces:
            row.insert(0, meta.get("namespace", ""))
        rows.append(row)
    return "\n".join(columns(rows)) + "\n"


def select_pod(pods: Sequence[Obj], role: str, index: int | None = None) -> Obj:
    """The pod whose logs `logs` reads: the newest submitter or head pod (a re-run submitter or a
    retry's new cluster replaces the old one), or worker `index` in name order."""
    from llmtrain.constants import ROLE_LABEL

    def labelled(pod: Obj) -> str:
        return str(((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, ""))

    mine = [p for p in pods if labelled(p) == role and not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not mine:
        roles = sorted({labelled(p) for p in pods} - {""})
        found = f" (it has {', '.join(roles)} pods)" if roles else " (it has no pods now)"
        raise PodNotFound(f"no {role} pod{found}")
    if role == "worker":
        ordered = sorted(mine, key=lambda p: str(p["metadata"]["name"]))
        position = index or 0
        if not 0 <= position < len(ordered):
            raise PodNotFound(
                f"no worker {position}: it has {len(ordered)} worker pod(s), 0 to {len(ordered) - 1}"
            )
        return ordered[position]
    return max(mine, key=lambda p: (str(p["metadata"].get("creationTimestamp", "")), p["metadata"]["name"]))


def saved_log_name(worker: int | None) -> str:
    """The saved file `logs --saved` prints: the driver's, or training rank `worker`'s."""
    return "driver.log" if worker is None else f"worker-{worker}.log"


def saved_logs_hint(name: str, worker: int | None) -> str:
    """Appended to "no pods" once a job's pods are gone: the trainer's saved logs outlive them."""
    which = "" if worker is None else f" --worker {worker}"
    return (
        f"; the logs the trainer saved in its run directory outlive its pods: "
        f"llmtrain logs {name} --saved{which}"
    )


def no_saved_log(job: str, directory: str, wanted: str, listing: Sequence[str]) -> str:
    """Why `logs --saved` has nothing to print, and what there is instead."""
    if not listing:
        return f"LLMTrainingJob {job}: no saved logs in {directory} (the trainer has not started yet)"
    return f"LLMTrainingJob {job}: no {wanted} in {directory}; saved: {', '.join(listing)}"


def storage_after_delete(job: Obj, pvc: str) -> str:
    """What `llmtrain delete` says of the job's storage, from its stored spec: whether the runs and
    the exported model on it are still there, and how to free the space if so. `pvc` is the name
    of a created claim (`<job>-storage`, shortened past the name limit)."""
    storage = (job.get("spec") or {}).get("storage") or {}
    namespace = (job.get("metadata") or {}).get("namespace", "")
    if storage.get("claimName"):
        return f'persistentvolumeclaim "{storage["claimName"]}" kept (storage.claimName: it is yours)'
    if (storage.get("create") or {}).get("reclaim", "Retain") == "Delete":
        return (
            f'persistentvolumeclaim "{pvc}" deleted with it, and every run and model on it '
            "(storage.create.reclaim: Delete)"
        )
    return (
        f'persistentvolumeclaim "{pvc}" kept with its runs and models (storage.create.reclaim: Retain); '
        f"a job applied again under this name uses it again. Free the space with: "
        f"kubectl delete pvc {pvc} -n {namespace}"
    )

"""Which job and which adapter an export reads: a job folder and one of its checkpoints.

A job is named by a path to its folder, or by its name (foreground runs,
`<data-dir>/jobs/<name>/`) or id (daemon runs, `<data-dir>/jobs/<id>/`) under
the data dir. The checkpoint is `best` (best/), `latest` (the newest complete
checkpoints/step-NNNNNN) or `step-N` (that checkpoint).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from appliance.config.schema import JobSpec
from appliance.errors import ExportError
from appliance.paths import jobs_dir

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
STEP_PATTERN = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class JobSource:
    """A finished or running job folder and its frozen spec."""

    path: Path
    spec: JobSpec

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class AdapterSource:
    """One adapter of a job: where its files are, which step wrote it and the metric it had."""

    selector: str  # "best" | "latest" | "step-N" as asked
    folder: Path  # holds adapter_model.safetensors and adapter_config.json
    step: int
    metric_name: str | None
    metric_value: float | None


def find_job(reference: str | Path, data_dir: Path) -> JobSource:
    """A job folder from a path, or a name/id under `<data-dir>/jobs/`."""
    reference = str(reference)
    as_path = Path(reference).expanduser()
    # A path is tried first; a bare word is also a job name or id under the data dir.
    candidates = [as_path] if ("/" in reference or as_path.is_dir()) else []
    candidates.append(jobs_dir(data_dir) / reference)
    for folder in candidates:
        if (folder / "job.yaml").is_file():
            return JobSource(folder.resolve(), _load_spec(folder / "job.yaml"))
    known = (
        sorted(p.name for p in jobs_dir(data_dir).iterdir() if (p / "job.yaml").is_file())
        if jobs_dir(data_dir).is_dir()
        else []
    )
    raise ExportError(
        f"no job '{reference}': neither a job folder (with job.yaml) nor a job name or id under {jobs_dir(data_dir)} "
        f"(known: {', '.join(known) or 'none'}); pass the job's folder or --data-dir"
    )


def _load_spec(path: Path) -> JobSpec:
    try:
        return JobSpec.model_validate(yaml.safe_load(path.read_text()))
    except Exception as error:  # yaml and pydantic raise their own types; both mean a damaged frozen spec
        raise ExportError(f"{path} is not a readable job spec ({type(error).__name__}: {error})") from None


def _complete_checkpoints(job: Path) -> dict[int, Path]:
    """step -> checkpoint folder, for every complete checkpoint (state.json present)."""
    found = {}
    root = job / "checkpoints"
    if root.is_dir():
        for folder in root.iterdir():
            match = STEP_PATTERN.match(folder.name)
            if match and (folder / "state.json").is_file():  # state.json is written last: the checkpoint is whole
                found[int(match.group(1))] = folder
    return found


def _adapter_in(folder: Path) -> Path | None:
    for candidate in (folder / "adapter", folder):  # a checkpoint keeps it in adapter/; best/ may hold it at its top
        if (candidate / ADAPTER_WEIGHTS).is_file() and (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    return None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _from_checkpoint(selector: str, step: int, folder: Path, job: JobSource) -> AdapterSource:
    adapter = _adapter_in(folder)
    if adapter is None:
        raise ExportError(f"checkpoint {folder} holds no {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG}; it is damaged")
    state = _read_json(folder / "state.json")
    metric = state.get("best_metric") or job.spec.checkpoint.best_metric
    value = (state.get("metrics") or {}).get(metric)
    return AdapterSource(selector, adapter, step, metric, float(value) if isinstance(value, (int, float)) else None)


def find_adapter(job: JobSource, selector: str = "best") -> AdapterSource:
    """The adapter `selector` names in `job` (best | latest | step-N)."""
    checkpoints = _complete_checkpoints(job.path)
    if selector == "best":
        best = job.path / "best"
        adapter = _adapter_in(best.resolve()) if best.exists() else None
        if adapter is None:
            raise ExportError(
                f"{job.path} has no best/ adapter yet (it appears at the first checkpoint); "
                "use --checkpoint latest or step-N, or wait for a checkpoint"
            )
        state = _read_json(adapter / "best.json") or _read_json(best / "best.json")
        step = int(state.get("step", 0))
        if "metric" in state:  # {"step", "metric", "value", "mode"}
            metric, value = state.get("metric"), state.get("value")
        else:  # older runs: {"step", <metric>: value}
            metric = next((key for key in state if key != "step"), None)
            value = state.get(metric) if metric else None
        return AdapterSource("best", adapter, step, metric, float(value) if isinstance(value, (int, float)) else None)
    if selector == "latest":
        if not checkpoints:
            raise ExportError(
                f"{job.path} has no complete checkpoint yet; wait for one (checkpoint.every) or export best"
            )
        step = max(checkpoints)
        return _from_checkpoint("latest", step, checkpoints[step], job)
    match = STEP_PATTERN.match(selector)
    if not match:
        raise ExportError(f"--checkpoint '{selector}' is not one of best, latest or step-N (e.g. step-20)")
    step = int(match.group(1))
    if step not in checkpoints:
        kept = ", ".join(f"step-{s}" for s in sorted(checkpoints)) or "none"
        raise ExportError(f"{job.path} has no complete checkpoint at step {step} (kept: {kept})")
    return _from_checkpoint(selector, step, checkpoints[step], job)

"""A submitted job file -> a spec the daemon may run and its memory plan, or every reason it may not.

The daemon never runs or reads what a caller points at:
- a reward plugin ("file.py:function") must resolve inside `<data-dir>/plugins/`
  (relative names start there), where an administrator installed it;
- `task.dataset` is read only inside the dataset roots (`<data-dir>/datasets/`
  or the configured list; relative names start at the first root); any other
  file comes as an upload with the submission, bounded in size, and is checked
  line by line by the same loader as `appliance config check`;
- a model is a name in the model store or a folder under a model root the
  administrator configured, with no link out of it (job_checks.confined_model_problem).
Nothing here materialises a dataset: rows are counted, a multiply range is
counted arithmetically. service/admission.py runs this in a child process.
Everything else is the existing validation (config.job_file + job_checks), so a
refusal lists the errors exactly as `appliance config check` prints them. A
job that does not fit the device is refused with its plan.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.job_checks import (
    PLUGIN_REWARD,
    is_path_reference,
    layout_refusals,
    with_absolute_paths,
    world_errors,
)
from appliance.config.job_file import ConfigError, ParsedJob, parse_job
from appliance.config.schema import JobSpec
from appliance.durable import write_atomically
from appliance.errors import ApplianceError
from appliance.service.api import ConfigErrorItem, SubmitRequest
from appliance.service.job_store import StoreUnwritable

UPLOAD_FILE = "dataset.jsonl"


class SubmissionRejected(ApplianceError):
    """The job is refused: `status` is the HTTP status, `errors` the job-file errors, `plan` when it does not fit."""

    def __init__(self, status: int, message: str, errors: list[ConfigError] | None = None, plan: dict | None = None):
        super().__init__(message)
        self.status, self.errors, self.plan = status, errors or [], plan
        self.http_status = status

    def items(self) -> list[ConfigErrorItem]:
        return [ConfigErrorItem(**error.as_dict(), text=str(error)) for error in self.errors]


@dataclass(frozen=True)
class Policy:
    """What a submission may reach on this box."""

    data_dir: Path
    plugins_dir: Path
    dataset_roots: tuple[Path, ...]
    uploads_dir: Path
    max_upload_bytes: int
    secrets_roots: tuple[Path, ...] = ()  # default: <data-dir>/secrets
    judge_endpoints: tuple[str, ...] = ()  # URLs whose origin a judge.endpoint may name; none by default
    model_roots: tuple[Path, ...] = ()  # folders model paths may name, besides the model store

    def secret_roots(self) -> tuple[Path, ...]:
        return self.secrets_roots or (self.data_dir / "secrets",)

    def models_roots(self) -> tuple[Path, ...]:
        """Where a model folder may lie: the model store, then the administrator's roots."""
        from appliance.paths import models_dir

        return (models_dir(self.data_dir), *self.model_roots)


@dataclass(frozen=True)
class Accepted:
    spec: JobSpec
    plan: dict[str, Any]  # appliance.budget.plan.Plan.to_dict()
    upload_dir: Path | None  # holds the uploaded dataset the spec points at; removed if the job is not stored

    def discard(self) -> None:
        if self.upload_dir is not None:
            shutil.rmtree(self.upload_dir, ignore_errors=True)


def _inside(path: Path, root: Path) -> bool:
    # Both sides resolved: a symlink or "../" that leads out of the root is outside, whatever the name says.
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def _with_dataset(parsed: ParsedJob, dataset: str) -> ParsedJob:
    data = dict(parsed.data)
    data["task"] = {**data["task"], "dataset": dataset}
    spec = parsed.spec
    if spec is not None:
        spec = spec.model_copy(update={"task": spec.task.model_copy(update={"dataset": dataset})})
    return dataclasses.replace(parsed, data=data, spec=spec)


def _dataset(
    parsed: ParsedJob, request: SubmitRequest, policy: Policy
) -> tuple[ParsedJob, list[ConfigError], Path | None]:
    """Point task.dataset at the upload or at a file in an allowed root; an error when it is neither."""
    task = parsed.data.get("task")
    reference = task.get("dataset") if isinstance(task, dict) else None
    unexpected = [name for name in request.uploads if name != reference]
    if unexpected:
        return (
            parsed,
            [
                parsed.error_at(
                    ("task", "dataset"),
                    (
                        f"an uploaded file is named {unexpected[0]!r} but task.dataset is {reference!r}; "
                        "upload only the job's dataset, under the name task.dataset gives it"
                    ),
                )
            ],
            None,
        )
    if not isinstance(reference, str) or not reference or reference.startswith("builtin:"):
        return parsed, [], None  # the schema and the dataset check report what is wrong
    if reference in request.uploads:
        # A fresh folder per submission: two jobs that upload a file of the same name never share it.
        upload_dir = policy.uploads_dir / uuid.uuid4().hex
        target = upload_dir / UPLOAD_FILE
        try:
            upload_dir.mkdir(parents=True, mode=0o750)
            write_atomically(target, request.uploads[reference], mode=0o640)  # fsynced before the job exists
        except OSError as error:
            shutil.rmtree(upload_dir, ignore_errors=True)
            raise StoreUnwritable(
                f"the upload {target} could not be written ({error.strerror or error}); nothing was submitted. "
                "Free space on its file system (or fix the I/O error) and retry"
            ) from error
        return _with_dataset(parsed, os.path.realpath(target)), [], upload_dir  # link-free, as workers read it
    roots = policy.dataset_roots
    candidate = Path(reference).expanduser()
    if not candidate.is_absolute():  # relative names start at the first root
        candidate = roots[0] / candidate
    if not any(_inside(candidate, root) for root in roots):
        return (
            parsed,
            [
                parsed.error_at(
                    ("task", "dataset"),
                    (
                        f"the daemon reads datasets only inside {', '.join(str(root) for root in roots)}, and {reference} "
                        "is not there; 'appliance jobs submit' uploads a file it can read, or an administrator copies it "
                        f"into {roots[0]}"
                    ),
                )
            ],
            None,
        )
    # The resolved path is what the job keeps: a link changed after the check cannot point it elsewhere.
    return _with_dataset(parsed, os.path.realpath(candidate)), [], None


def _plugins(parsed: ParsedJob, plugins_dir: Path) -> tuple[ParsedJob, list[ConfigError]]:
    """Plugins resolve inside the plugin dir; others are refused and hidden from the checks (never read)."""
    rewards = parsed.data.get("rewards")
    if not isinstance(rewards, list):
        return parsed, []
    errors, kept = [], []
    for position, reward in enumerate(rewards):
        name = reward.get("name") if isinstance(reward, dict) else None
        match = PLUGIN_REWARD.match(name) if isinstance(name, str) else None
        if match and not _inside(plugins_dir / Path(match["file"]).expanduser(), plugins_dir):
            errors.append(
                parsed.error_at(
                    ("rewards", position, "name"),
                    (
                        f"reward plugin '{name}' is outside the plugin folder {plugins_dir}; the daemon runs only "
                        "plugins an administrator installed there (name them file.py:function, relative to it)"
                    ),
                )
            )
            reward = {**reward, "name": None}  # hidden from the checks below, which would otherwise load it
        kept.append(reward)
    if not errors:
        return parsed, []
    return dataclasses.replace(parsed, data={**parsed.data, "rewards": kept}), errors


def _origin(url: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)  # "http://a" and "http://a:80" are one
    except ValueError:
        return None
    return (parts.scheme.lower(), (parts.hostname or "").lower(), port) if parts.hostname else None


def _token_problem(reference: str, roots: tuple[Path, ...]) -> str | None:
    """Why the daemon may not read `reference` as a judge token file (None when it may)."""
    candidate = Path(reference).expanduser()
    if not candidate.is_absolute():
        candidate = roots[0] / candidate
    where = ", ".join(str(root) for root in roots)
    # One answer for every refusal: a caller learns nothing about which files exist there.
    refusal = (
        f"judge.token_file must name a token file an administrator installed in {where} (a regular file, "
        f"owned by the daemon's user, mode 600); {reference!r} is not one"
    )
    if not any(_inside(candidate, root) for root in roots):
        return refusal
    try:
        info = os.stat(os.path.realpath(candidate))
    except OSError:
        return refusal
    # As ssh treats private keys: no access for group or others, owned by the daemon's user (or root).
    if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid not in (0, os.geteuid()):
        return refusal
    return None


def _judge_errors(parsed: ParsedJob, policy: Policy) -> tuple[ParsedJob, list[ConfigError]]:
    """judge.token_file confined to the secrets roots, judge.endpoint to the administrator's allow-list."""
    judge = parsed.data.get("judge")
    if not isinstance(judge, dict):
        return parsed, []
    errors, hidden = [], {}
    token_file, endpoint = judge.get("token_file"), judge.get("endpoint")
    if isinstance(token_file, str) and token_file:
        problem = _token_problem(token_file, policy.secret_roots())
        if problem:
            errors.append(parsed.error_at(("judge", "token_file"), problem))
            hidden["token_file"] = None  # never read by the checks that follow
        else:
            hidden["token_file"] = os.path.realpath(policy.secret_roots()[0] / Path(token_file).expanduser())
    if isinstance(endpoint, str) and endpoint:
        # Compared by origin (scheme, host, port): a path cannot smuggle another host past the allow-list.
        allowed = {_origin(url) for url in policy.judge_endpoints} - {None}
        if _origin(endpoint) not in allowed:
            listed = ", ".join(policy.judge_endpoints) or "none"
            errors.append(
                parsed.error_at(
                    ("judge", "endpoint"),
                    f"judge endpoint {endpoint!r} is not on this daemon's allow-list ({listed}); an administrator "
                    "adds it with 'appliance serve --judge-endpoint URL'",
                )
            )
    if not hidden:
        return parsed, errors
    spec = parsed.spec
    if spec is not None and spec.judge is not None and hidden.get("token_file"):
        spec = spec.model_copy(update={"judge": spec.judge.model_copy(update={"token_file": hidden["token_file"]})})
    data = {**parsed.data, "judge": {**judge, **hidden}}
    return dataclasses.replace(parsed, data=data, spec=spec), errors


def check_submission(request: SubmitRequest, policy: Policy, device) -> Accepted:
    """The runnable spec and its plan on `device`, or SubmissionRejected (nothing is kept)."""
    # Checked first: an upload over the limit is refused before any of it is parsed or written.
    size = sum(len(text.encode("utf-8")) for text in request.uploads.values())
    if size > policy.max_upload_bytes:
        raise SubmissionRejected(
            413,
            (
                f"the uploaded dataset is {size} bytes, over this daemon's limit of {policy.max_upload_bytes} bytes; "
                f"ask an administrator to put it in {policy.dataset_roots[0]} and name it there"
            ),
        )
    parsed = parse_job(request.yaml, request.file_name)
    if not isinstance(parsed.data, dict):
        raise SubmissionRejected(422, f"{request.file_name} is not a valid job file", parsed.errors)
    parsed, errors, upload_dir = _dataset(parsed, request, policy)
    try:
        parsed, plugin_errors = _plugins(parsed, policy.plugins_dir)
        parsed, judge_errors = _judge_errors(parsed, policy)
        errors = parsed.errors + errors + plugin_errors + judge_errors
        errors += world_errors(parsed, policy.plugins_dir, policy.data_dir, model_roots=policy.models_roots())
        if upload_dir is not None:  # say the user's file name, not where the daemon keeps the upload
            staged, original = str(upload_dir / UPLOAD_FILE), request.uploads and next(iter(request.uploads))
            errors = [dataclasses.replace(e, message=e.message.replace(staged, str(original))) for e in errors]
        if errors:
            # In file order, as `appliance config check` prints them.
            errors.sort(key=lambda e: e.line if e.line is not None else 0)
            raise SubmissionRejected(422, f"{request.file_name} has {len(errors)} error(s)", errors)
        spec = _real_model_paths(with_absolute_paths(parsed.spec, policy.plugins_dir))
        plan = plan_on(spec, policy.data_dir, device)
        refused = layout_refusals(spec, plan)  # what `auto` resolved to on this daemon's device
        if refused:
            errors = [parsed.error_at(key, why) for key, why in refused]
            raise SubmissionRejected(422, f"{request.file_name} has {len(errors)} error(s)", errors)
        if not plan.fits:
            raise SubmissionRejected(
                409, f"job '{spec.name}' does not fit this device: {plan.refusal()}", plan=plan.to_dict()
            )
        return Accepted(spec, plan.to_dict(), upload_dir)
    except BaseException:  # a refusal, or anything else: the written upload goes with it
        if upload_dir is not None:
            shutil.rmtree(upload_dir, ignore_errors=True)
        raise


def _real_model_paths(spec: JobSpec) -> JobSpec:
    """Model folders as the checks resolved them: a link changed after submit cannot move the job elsewhere."""
    student = spec.student
    if is_path_reference(student.model):
        student = student.model_copy(update={"model": os.path.realpath(student.model)})
    judge = spec.judge
    if judge is not None and judge.endpoint is None and is_path_reference(judge.model):
        judge = judge.model_copy(update={"model": os.path.realpath(judge.model)})
    return spec.model_copy(update={"student": student, "judge": judge})


def plan_on(spec: JobSpec, data_dir: Path, device):
    """The budget manager's plan of `spec` on `device` (model shapes from the model store)."""
    from appliance.budget.device_plans import plan_rank
    from appliance.budget.shapes import ShapeError, load_config
    from appliance.models.store import ModelStoreError, resolve_model

    try:
        student = load_config(resolve_model(spec.student.model, data_dir, verify=False) / "config.json")
        judge = None
        if spec.judge is not None and spec.judge.endpoint is None and not spec.judge.share_student_base:
            judge = load_config(resolve_model(spec.judge.model, data_dir, verify=False) / "config.json")
        # What each student device holds, sharded at load when the whole base does not fit: the trainer's plan.
        return plan_rank(spec, student, judge, device)
    except (ShapeError, ModelStoreError, ValueError) as error:
        raise SubmissionRejected(422, f"job '{spec.name}' cannot be planned: {error}") from error

"""Checks of a job file against the outside world, reported at the key and line they concern.

The schema (config/schema.py) says what a job file may contain; these checks say
whether this box can run it: the models are in the model store (or are model
folders), the dataset exists, each reward is registered or is a plugin file
that defines the named function, and the rewards make sense together.

Checks read the plain YAML data rather than the validated spec, so a file
with a schema error still gets every other problem reported in the same run.
Plugin files are parsed with `ast`, never imported: checking a job must not
run user code.
"""

from __future__ import annotations

import ast
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.bounded_file import MAX_SOURCE_BYTES, FileTooLarge, read_capped
from appliance.config.job_file import ConfigError, JobFileError, ParsedJob, read_job
from appliance.conventions import (
    BUILTIN_DATASET_PREFIX,
    ENVIRONMENT_REWARD,
    JUDGE_REWARD,
    PLUGIN_REWARD,
    PLUGIN_SYNTAX,
    is_builtin_dataset,
)
from appliance.suggest import closest, did_you_mean
from appliance.config.schema import JobSpec

if TYPE_CHECKING:
    from appliance.budget.plan import Plan


def registered_reward_names() -> list[str]:
    """Reward names the registry knows (imported lazily: the rewards package is not config)."""
    from appliance.rewards.registry import known_reward_names

    return sorted(known_reward_names())


def check_job_file(
    path: str | Path, data_dir: Path, check_models: bool = True
) -> tuple[JobSpec | None, list[ConfigError]]:
    """Validate a job file and check it against this box.

    Returns (spec, []) when everything is right, else (None, every error,
    ordered by line). The returned spec has its relative paths (model folders,
    dataset file, plugin files) made absolute against the job file's folder.
    `check_models=False` skips the model store and model folder checks, for
    files written for another box.
    """
    path = Path(path)
    parsed = read_job(path)
    if not isinstance(parsed.data, dict):
        return None, parsed.errors
    base_dir = path.absolute().parent
    errors = list(parsed.errors) + world_errors(parsed, base_dir, Path(data_dir), check_models)
    if errors:
        return None, sorted(errors, key=lambda e: e.line if e.line is not None else 0)
    assert parsed.spec is not None  # no errors means the schema accepted it
    return with_absolute_paths(parsed.spec, base_dir), []


def load_checked_job(path: str | Path, data_dir: Path) -> JobSpec:
    """The spec a trainer may run, or JobFileError listing every problem."""
    spec, errors = check_job_file(path, data_dir)
    if errors:
        raise JobFileError(errors)
    assert spec is not None
    return spec


def world_errors(
    parsed: ParsedJob,
    base_dir: Path,
    data_dir: Path,
    check_models: bool = True,
    model_roots: tuple[Path, ...] | None = None,
) -> list[ConfigError]:
    """Every outside-world problem in `parsed.data` (a mapping), each at its key.

    `model_roots` (the daemon's): a model folder must lie under one of them, links included; None: anywhere."""
    data = parsed.data
    errors: list[ConfigError] = _model_errors(parsed, base_dir, data_dir, model_roots) if check_models else []
    token_file = _at(data, "judge", "token_file")
    if isinstance(token_file, str) and token_file:
        path = _absolute(token_file, base_dir)
        if not path.is_file() or not os.access(path, os.R_OK):
            errors.append(
                parsed.error_at(
                    ("judge", "token_file"),
                    (f"token file {path} does not exist or cannot be read; give a file holding the endpoint's API key"),
                )
            )
    environment = _at(data, "task", "environment")
    dataset = parsed.spec.task.dataset if parsed.spec is not None else _at(data, "task", "dataset")
    if isinstance(environment, str) and environment:
        from appliance.agents.environment_loader import environment_problem

        problem = environment_problem(environment, data_dir)
        if problem:
            errors.append(parsed.error_at(("task", "environment"), problem))
        elif parsed.spec is not None:
            errors += _option_errors(parsed, data_dir)
    elif isinstance(dataset, str) and dataset:
        # With a valid schema the task itself is loaded (it also checks held_out against the
        # dataset size); otherwise only the dataset is checked.
        problem = dataset_problem(dataset, base_dir, read_rows=parsed.spec is None)
        if problem:
            errors.append(parsed.error_at(("task", "dataset"), problem))
        elif parsed.spec is not None:
            errors += _task_errors(parsed, base_dir)
    errors += _reward_errors(parsed, base_dir)
    errors += _best_metric_errors(parsed)
    errors += _resources_errors(parsed)
    errors += _sampling_errors(parsed)
    errors += _rubric_errors(parsed)
    return errors


def _model_errors(
    parsed: ParsedJob, base_dir: Path, data_dir: Path, model_roots: tuple[Path, ...] | None
) -> list[ConfigError]:
    """student.model and a local judge.model: in the model store, or a folder (under `model_roots` when given)."""
    data = parsed.data
    errors: list[ConfigError] = []
    store_names: list[str] | None = None
    for section in ("student", "judge"):
        if section == "judge" and _at(data, "judge", "endpoint"):
            continue  # a remote judge's model is a name its server serves, not one of this box
        reference = _at(data, section, "model")
        if isinstance(reference, str) and reference:
            if store_names is None:
                from appliance.models.store import ModelStore

                store_names = ModelStore(data_dir).names()
            problem = (
                confined_model_problem(reference, f"{section}.model", model_roots, data_dir)
                if model_roots is not None and is_path_reference(reference)
                else model_problem(reference, base_dir, data_dir, store_names)
            )
            if problem:
                errors.append(parsed.error_at((section, "model"), problem))
    return errors


def _option_errors(parsed: ParsedJob, data_dir: Path) -> list[ConfigError]:
    """task.environment_options: each key a parameter of the environment, of its type and within its bounds."""
    from appliance.agents.environment_loader import option_problems

    task = parsed.spec.task
    found = option_problems(task.environment, dict(task.environment_options), data_dir)
    return [parsed.error_at(("task", "environment_options", key), problem) for key, problem in found]


def _sampling_errors(parsed: ParsedJob) -> list[ConfigError]:
    """dynamic_sampling and skip_settled_after draw from the job's own prompt order: one rank, a dataset task."""
    spec = parsed.spec
    if spec is None:
        return []
    errors = []
    for key in ("dynamic_sampling", "skip_settled_after"):
        if not getattr(spec.grpo, key):
            continue
        if spec.task.environment is not None:
            why = "an agent job's groups come from its environment, not from a prompt order"
        elif spec.resources.world_size > 1:
            why = f"it draws prompts on one rank, and this job has {spec.resources.world_size}"
        else:
            continue
        errors.append(parsed.error_at(("grpo", key), f"{key} is not available here: {why}; drop it"))
    return errors


def _rubric_errors(parsed: ParsedJob) -> list[ConfigError]:
    """judge.rubric: no score outside the scale that judge.scoring reads (numbers in judge.rubric_numbers excepted)."""
    from appliance.judge.rubric import RubricScaleError, check_rubric_scale

    rubric, scoring = _at(parsed.data, "judge", "rubric"), _at(parsed.data, "judge", "scoring")
    allowed = _at(parsed.data, "judge", "rubric_numbers")
    if not isinstance(rubric, str):
        return []
    allowed = [value for value in allowed if isinstance(value, (int, float))] if isinstance(allowed, list) else []
    try:
        check_rubric_scale(rubric, scoring if isinstance(scoring, str) else "auto", allowed)
    except RubricScaleError as error:
        return [parsed.error_at(("judge", "rubric"), str(error))]
    return []


def _resources_errors(parsed: ParsedJob) -> list[ConfigError]:
    """resources: a judge placement needs a judge on this box; each rank needs a whole share of the groups."""
    spec = parsed.spec
    if spec is None:
        return []
    resources, errors = spec.resources, []
    ranks = resources.world_size
    if ranks > 1 and spec.task.environment is not None:
        errors.append(
            parsed.error_at(
                ("resources", "gpus"),
                f"an agent job (task.environment) runs on one rank, not {ranks}; set resources.gpus: 1 and nodes: 1",
            )
        )
    if ranks > 1 and spec.grpo.prompts_per_step % ranks:
        errors.append(
            parsed.error_at(
                ("grpo", "prompts_per_step"),
                f"prompts_per_step ({spec.grpo.prompts_per_step}) must split evenly over the job's {ranks} "
                f"data-parallel ranks (resources); use a multiple of {ranks}",
            )
        )
    return errors + [parsed.error_at(key, message) for key, message in layout_refusals(spec)]


def layout_refusals(spec: JobSpec, plan: Plan | None = None) -> list[tuple[tuple[str, ...], str]]:
    """Placements the runtime does not deliver, each refused in one sentence at its key (docs/scaling.md).

    Without a plan (config check) the job's own settings are read; with its plan (`appliance plan`, the daemon's
    admission, the trainer at start) the sharding, rollout engine and rollout weights that `auto` resolved to.
    """
    resources, ranks = spec.resources, spec.resources.world_size
    tensor_parallel = spec.engine.vllm.tensor_parallel_size
    sharding = plan.choices.sharding if plan is not None else resources.sharding
    rollout = plan.rollout_engine if plan is not None else spec.engine.rollout
    weights = plan.choices.rollout_weights if plan is not None else spec.engine.rollout_weights
    refusals = []
    placed = _judge_placement_problem(spec, plan)
    if placed:
        refusals.append((("resources", "judge_gpus"), placed))
    elif resources.judge_gpus and ranks > 1:
        why = (
            f"a judge on devices of its own serves a one-rank job, and this job has {ranks} ranks; serve the judge "
            "with 'vllm serve --tensor-parallel-size N' on those devices and set judge.endpoint, or leave one rank"
        )
        refusals.append((("resources", "judge_gpus"), why))
    if resources.sharding == "fsdp" and ranks == 1:
        why = "sharding: fsdp shards the base over the job's ranks and this job has one; set gpus to 2 or more"
        refusals.append((("resources", "sharding"), why))
    if sharding == "fsdp" and weights == "merged_copy":
        why = (
            "a merged copy is a whole dequantized copy of the base on every rank, which a base sharded "
            f"{'as the plan chose ' if resources.sharding == 'auto' else ''}exists to avoid; set rollout_weights: "
            "shared, or engine.rollout: vllm with engine.vllm.tensor_parallel_size"
        )
        refusals.append((("engine", "rollout_weights"), why))
    if tensor_parallel > 1 and (ranks == 1 or resources.student_devices % tensor_parallel):
        why = (
            f"tensor_parallel_size ({tensor_parallel}) is the group of ranks on one box that share a vLLM copy; it "
            f"must divide the job's {resources.student_devices} student device(s) a box, with more than one rank"
        )
        refusals.append((("engine", "vllm", "tensor_parallel_size"), why))
    local_judge = spec.judge is not None and spec.judge.endpoint is None and not spec.judge.share_student_base
    if local_judge and ranks > 1 and spec.engine.judge == "vllm":
        why = (
            f"a vLLM judge on each of the job's {ranks} ranks is not run (vLLM runs once per rank, as the student's "
            "engine); set engine.judge: hf (or auto), or serve the judge elsewhere and set judge.endpoint"
        )
        refusals.append((("engine", "judge"), why))
    if tensor_parallel > 1 and rollout == "hf":
        generates = (
            "engine.rollout: auto is transformers on this device"
            if spec.engine.rollout == "auto"
            else "this job generates with transformers"
        )
        why = f"tensor_parallel_size splits vLLM's copy of the student, and {generates}; set engine.rollout: vllm"
        refusals.append((("engine", "vllm", "tensor_parallel_size"), why))
    return refusals


def _judge_placement_problem(spec: JobSpec, plan: Plan | None) -> str:
    """Why judge_gpus places no judge here, or "": only a local vLLM judge of its own runs on those devices (its
    engine tensor-parallel over them); a transformers judge would load on the student's device the plan left free."""
    from appliance.budget.workload import judge_engine_of

    judge, devices = spec.judge, spec.resources.judge_gpus
    if not devices:
        return ""
    if judge is None or judge.endpoint is not None or judge.share_student_base:
        held = (
            "no judge section"
            if judge is None
            else "a remote judge (judge.endpoint)"
            if judge.endpoint is not None
            else "a judge that is the student's base (judge.share_student_base)"
        )
        return f"judge_gpus ({devices}) places a judge on this box, but the job has {held}; drop judge_gpus"
    # The rank's plan holds no judge with devices of its own: the judge's engine resolves on the plan's device.
    if plan is not None and plan.device.kind == "cpu":
        return (
            f"judge_gpus ({devices}) gives the judge GPUs of its own and this box has none (the CPU); drop judge_gpus"
        )
    engine = judge_engine_of(spec, plan.device.kind) if plan is not None else spec.engine.judge
    if engine != "hf":
        return ""
    how = "engine.judge: auto is transformers on this device" if spec.engine.judge == "auto" else "engine.judge is hf"
    return (
        f"judge_gpus ({devices}) gives the judge devices of its own, which only a vLLM judge runs on, and {how}; "
        "set engine.judge: vllm, or drop judge_gpus"
    )


def _best_metric_errors(parsed: ParsedJob) -> list[ConfigError]:
    """checkpoint.best_metric names a number every record (or every evaluated record) carries."""
    from appliance.config.best import EVAL_METRICS, allowed_metrics, evaluation_every

    metric = _at(parsed.data, "checkpoint", "best_metric")
    if not isinstance(metric, str):
        return []  # absent (the default) or the schema reports its type
    rewards = parsed.data.get("rewards")
    names = (
        [r["name"] for r in rewards if isinstance(r, dict) and isinstance(r.get("name"), str)]
        if isinstance(rewards, list)
        else []
    )
    allowed = allowed_metrics(names)
    key = ("checkpoint", "best_metric")
    if metric not in allowed:
        hint = did_you_mean(metric, allowed) or f"; one of: {', '.join(allowed)}"
        return [parsed.error_at(key, f"unknown metric '{metric}'{hint}")]
    if metric in EVAL_METRICS and parsed.spec is not None and evaluation_every(parsed.spec) is None:
        return [
            parsed.error_at(
                key,
                f"'{metric}' is measured only when the job evaluates held-out problems during training; set "
                "checkpoint.eval_every (e.g. 10; auto needs task.held_out above 0) or follow a training metric "
                "such as reward_mean",
            )
        ]
    return []


def model_problem(reference: str, base_dir: Path, data_dir: Path, store_names: list[str]) -> str | None:
    """Why `reference` (a store name, or a folder path if it has a '/') cannot be loaded here."""
    if is_path_reference(reference):
        folder = _absolute(reference, base_dir)
        if not folder.is_dir():
            return (
                f"model folder {folder} does not exist; give a Hugging Face model folder or a name from the model store"
            )
        if not (folder / "config.json").is_file():
            return f"model folder {folder} has no config.json; point at a Hugging Face model folder"
        return None
    if reference in store_names:
        return None
    from appliance.paths import models_dir

    where = models_dir(data_dir)
    if not store_names:
        return (
            f"model '{reference}' is not in the model store at {where}, which is empty; "
            "run 'appliance models provision-demo' or 'appliance models import DIR --name NAME'"
        )
    close = closest(reference, store_names)
    hint = f"did you mean '{close}'?" if close else f"stored models: {', '.join(store_names)}"
    return f"model '{reference}' is not in the model store at {where}; {hint}"


# How many entries of a model folder the confinement check looks at (a model folder holds a few dozen).
MAX_MODEL_FOLDER_ENTRIES = 10_000


def confined_model_problem(reference: str, key: str, roots: tuple[Path, ...], data_dir: Path) -> str | None:
    """Why the daemon may not load the model folder `reference` (a path): it must be absolute and lie under a
    root, after links, and no entry of it may be a link out of that root. A refusal says nothing about what
    exists outside the roots (the path is compared before anything is looked at)."""
    from appliance.paths import models_dir

    where = ", ".join(str(root) for root in roots if root != models_dir(data_dir)) or "none configured"
    refusal = (
        f"{key} must name a model in the model store (appliance models list) or a folder under the daemon's model "
        f"roots ({where}); {reference!r} is neither, so ask an administrator to import it"
    )
    candidate = Path(os.path.normpath(reference))
    root = next((root for root in roots if reference.startswith("/") and candidate.is_relative_to(root)), None)
    if root is None:
        return refusal
    real, real_root = Path(os.path.realpath(candidate)), Path(os.path.realpath(root))
    if not real.is_relative_to(real_root):
        return refusal
    if not (real / "config.json").is_file():
        return f"{key}: {reference} has no config.json; point at a Hugging Face model folder under {root}"
    try:
        with os.scandir(real) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_MODEL_FOLDER_ENTRIES:
                    return f"{key}: {reference} holds more than {MAX_MODEL_FOLDER_ENTRIES} entries; not a model folder"
                if entry.is_symlink() and not Path(os.path.realpath(entry.path)).is_relative_to(real_root):
                    return (
                        f"{key}: {reference} holds {entry.name!r}, a link out of {root}; the daemon follows no link out"
                    )
    except OSError as error:
        return f"{key}: {reference} cannot be read ({error.strerror})"
    return None


def dataset_problem(dataset: str, base_dir: Path, read_rows: bool = True) -> str | None:
    """Why `task.dataset` cannot be read here; with `read_rows` every row of a .jsonl file is checked."""
    from appliance.tasks.task import TaskError
    from appliance.tasks.jsonl import count_problems
    from appliance.tasks.load import BUILTINS

    builtins = [BUILTIN_DATASET_PREFIX + name for name in BUILTINS]
    if dataset in builtins:
        return None
    close = closest(dataset.removeprefix(BUILTIN_DATASET_PREFIX), list(BUILTINS))
    hint = f"; did you mean '{BUILTIN_DATASET_PREFIX}{close}'?" if close else ""
    if dataset.startswith(BUILTIN_DATASET_PREFIX):
        return f"unknown built-in dataset '{dataset}'{hint or '; built-in: ' + ', '.join(builtins)}"
    if not dataset.endswith(".jsonl"):
        return f"'{dataset}' is neither {' nor '.join(builtins)} nor a .jsonl file{hint}"
    file = _absolute(dataset, base_dir)
    if not file.is_file():
        return f"dataset file {file} does not exist (relative paths start at the job file's folder)"
    if read_rows:
        try:
            count_problems(file)  # every row checked, none kept
        except TaskError as exc:
            return _one_line(exc)
        except (OSError, UnicodeDecodeError) as exc:
            return f"dataset file {file} cannot be read: {exc}"
    return None


def _task_errors(parsed: ParsedJob, base_dir: Path) -> list[ConfigError]:
    """What loading the task would refuse, found by counting its problems (none is built): errors name
    task.held_out or concern the dataset."""
    from appliance.tasks.task import TaskError
    from appliance.tasks.load import held_out_problem

    try:
        message = held_out_problem(parsed.spec.task, base_dir)
    except TaskError as exc:
        message = _one_line(exc)
    except (OSError, UnicodeDecodeError) as exc:
        return [parsed.error_at(("task", "dataset"), f"dataset cannot be read: {exc}")]
    if message is None:
        return []
    key = ("task", "held_out") if message.startswith("task.held_out") else ("task", "dataset")
    return [parsed.error_at(key, message)]


def _one_line(exc: Exception) -> str:
    """Task errors list one bad row per line; an error here must stay on one line."""
    first, *rows = str(exc).splitlines()
    return first.rstrip(":") + (": " + "; ".join(rows) if rows else "")


def plugin_problem(file_part: str, function: str, base_dir: Path) -> str | None:
    """Why `file_part:function` is not a usable plugin reward; the file is parsed, not run."""
    file = _absolute(file_part, base_dir)
    if not file.is_file():
        return f"plugin file {file} does not exist (relative paths start at the job file's folder)"
    try:
        tree = ast.parse(read_capped(file, MAX_SOURCE_BYTES), filename=str(file))
    except SyntaxError as exc:
        return f"plugin file {file} has a syntax error on line {exc.lineno}: {exc.msg}"
    except (OSError, ValueError, FileTooLarge) as exc:
        return f"plugin file {file} cannot be read: {exc}"
    defined = _top_level_names(tree)
    if function in defined:
        return None
    close = closest(function, sorted(defined))
    hint = f"; did you mean '{close}'?" if close else (f"; it defines: {', '.join(sorted(defined))}" if defined else "")
    return f"plugin file {file} defines no top-level function '{function}'{hint}"


def _reward_errors(parsed: ParsedJob, base_dir: Path) -> list[ConfigError]:
    rewards = parsed.data.get("rewards")
    if not isinstance(rewards, list):
        return []
    errors: list[ConfigError] = []
    first_seen: dict[str, int] = {}
    registered: list[str] | None = None
    has_judge = isinstance(parsed.data.get("judge"), dict)
    has_environment = isinstance(_at(parsed.data, "task", "environment"), str)
    for position, reward in enumerate(rewards):
        name = reward.get("name") if isinstance(reward, dict) else None
        if not isinstance(name, str) or not name:
            continue  # the schema reports it
        key = ("rewards", position, "name")
        if name in first_seen:
            errors.append(
                parsed.error_at(
                    key,
                    (
                        f"reward '{name}' is already listed as rewards[{first_seen[name]}]; keep one entry and give it the summed weight"
                    ),
                )
            )
            continue
        first_seen[name] = position
        plugin = PLUGIN_REWARD.match(name)
        if name == ENVIRONMENT_REWARD:
            problem = (
                None
                if has_environment
                else ("the 'environment' reward is an agent environment's own reward; set task.environment or drop it")
            )
        elif plugin:
            problem = plugin_problem(plugin["file"], plugin["function"], base_dir)
        elif ":" in name:
            problem = f"a plugin reward is written {PLUGIN_SYNTAX}, not '{name}'"
        else:
            if registered is None:  # the registry is imported only when a job names a registered reward
                registered = registered_reward_names()
            problem = _registered_problem(name, registered)
            if problem is None and name == JUDGE_REWARD and not has_judge:
                problem = (
                    "the 'judge' reward needs a 'judge' section (model, mode, rubric); add one or drop this reward"
                )
        if problem:
            errors.append(parsed.error_at(key, problem))
    weights = [_weight_of(reward) for reward in rewards if isinstance(reward, dict)]
    if weights and all(weight == 0.0 for weight in weights):
        errors.append(
            parsed.error_at(
                ("rewards",),
                "every reward has weight 0, so no completion is preferred; give at least one a non-zero weight",
            )
        )
    return errors


def _registered_problem(name: str, registered: list[str]) -> str | None:
    if name in registered:
        return None
    close = closest(name, registered)
    hint = f"did you mean '{close}'?" if close else f"registered: {', '.join(registered)}"
    return f"unknown reward '{name}'; {hint} (or a plugin: {PLUGIN_SYNTAX})"


def _weight_of(reward: dict) -> float | None:
    weight = reward.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        return None  # the schema reports it
    return float(weight)


def with_absolute_paths(spec: JobSpec, base_dir: Path) -> JobSpec:
    """The spec with model folders, the dataset file and plugin files as absolute paths.

    A job runs from wherever the daemon or trainer starts, and its frozen copy
    is stored under the data dir; neither knows the job file's folder.
    """
    student = spec.student
    if is_path_reference(student.model):
        student = student.model_copy(update={"model": str(_absolute(student.model, base_dir))})
    judge = spec.judge
    if judge is not None and judge.endpoint is None and is_path_reference(judge.model):
        judge = judge.model_copy(update={"model": str(_absolute(judge.model, base_dir))})
    if judge is not None and judge.token_file is not None:
        judge = judge.model_copy(update={"token_file": str(_absolute(judge.token_file, base_dir))})
    task = spec.task
    if not is_builtin_dataset(task.dataset):
        task = task.model_copy(update={"dataset": str(_absolute(task.dataset, base_dir))})
    rewards = []
    for reward in spec.rewards:
        plugin = PLUGIN_REWARD.match(reward.name)
        if plugin:
            reward = reward.model_copy(update={"name": f"{_absolute(plugin['file'], base_dir)}:{plugin['function']}"})
        rewards.append(reward)
    return spec.model_copy(update={"student": student, "judge": judge, "task": task, "rewards": rewards})


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: functions, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")
    return names


def _at(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def is_path_reference(reference: str) -> bool:
    """A model value that is a folder path rather than a model store name."""
    return "/" in reference or reference.startswith("~")


def _absolute(reference: str, base_dir: Path) -> Path:
    return Path(os.path.normpath(base_dir / Path(reference).expanduser()))

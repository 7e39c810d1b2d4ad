"""`appliance plan FILE`: the itemized memory plan of a job per phase, against the budget.

Exit 0 when it fits, 3 when it does not (with the overflowing components and
the job-file changes that would fit), 2 on bad input. Only each model's
config.json is needed: from `--model-config NAME=PATH`, else the model store
or the model's folder, else a shipped shape whose name matches the model
(Qwen2.5-7B-Instruct -> Qwen2.5-7B), so a GPU box can be planned from a laptop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK, add_data_dir, data_dir_of
from appliance.errors import ApplianceError, UsageError


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="itemized memory plan per phase against the device budget (exit 3 when it does not fit)",
        description="Plan a job's memory per phase (generate, judge, train) against the budget. "
        "Exit 0 when it fits, 3 when it does not, 2 on bad input.",
    )
    plan.add_argument("file", type=Path, metavar="FILE")
    plan.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="plan for a device of this size (e.g. 80GiB) instead of probing this machine; "
        "the device is then taken to be CUDA unless --device says otherwise",
    )
    plan.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="the device kind (default: CUDA when visible, else the CPU)",
    )
    plan.add_argument(
        "--model-config",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="config.json to use for the model named NAME in the job (repeatable)",
    )
    plan.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_data_dir(plan)
    plan.set_defaults(handler=_plan)


def _overrides(items: list[str]) -> dict[str, Path]:
    overrides = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--model-config '{item}': write NAME=path/to/config.json")
        overrides[name] = Path(path)
    return overrides


def _matches(reference: str, name: str) -> bool:
    # NAME may be the job's whole reference or a path's last component ("models/qwen" matches "qwen").
    return name == reference or name == reference.rstrip("/").rsplit("/", 1)[-1]


def resolve_config(key: str, reference: str, data_dir: Path, overrides: dict[str, Path]) -> tuple[dict, str]:
    """The config.json of a job's model, and where it came from."""
    from appliance.budget.shapes import fixture_for, fixture_names, load_config
    from appliance.models.store import ModelStoreError, resolve_model

    # The operator's override first, then what is on this box, then a shipped shape by name: each is a surer
    # source of the real config than the next.
    for name, path in overrides.items():
        if _matches(reference, name):
            return load_config(path), str(path)
    try:
        folder = resolve_model(reference, data_dir, verify=False)
        return load_config(folder / "config.json"), str(folder / "config.json")
    except ModelStoreError as exc:
        store_problem = str(exc)
    fixture = fixture_for(reference)
    if fixture is not None:
        return load_config(fixture), f"shipped shape {fixture.stem}"
    raise UsageError(
        f"{key}: no config.json for '{reference}' ({store_problem}; no shipped shape matches: "
        f"{', '.join(fixture_names())}); pass --model-config {reference}=path/to/config.json"
    )


def _device(args):
    from appliance.budget.device_probe import DeviceInfo, cpu_bf16_matmul, probe_device
    from appliance.cli.main import size_option

    if args.device_memory:
        total = size_option("--device-memory", args.device_memory)
        if total <= 0:
            raise UsageError("--device-memory: the device size must be above zero")
        kind = args.device or "cuda"  # a sized device is planned as a GPU unless --device says otherwise
        bf16 = kind == "cuda" or cpu_bf16_matmul()  # a CPU of that size: this one's instructions
        return DeviceInfo(kind, total, 0, "(--device-memory)", bf16)
    try:
        return probe_device(args.device)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


def _measured_prompt_tokens(job, file: Path, data_dir: Path) -> int | None:
    """The job's longest prompt with the student's chat template, when its tokenizer and dataset are here."""
    from appliance.grpo.prompt_lengths import measure_prompt_tokens
    from appliance.models.store import resolve_model

    try:
        model_dir = resolve_model(job.student.model, data_dir, verify=False)
        return measure_prompt_tokens(job, model_dir, Path(file).resolve().parent)
    except (ApplianceError, OSError, ValueError):
        return None  # planned for another box: grpo.max_prompt_tokens stands in


def _plan(args) -> int:
    from appliance.budget.device_plans import plan_devices, refusal
    from appliance.config.job_file import JobFileError, load_job
    from appliance.job_checks import layout_refusals

    try:
        job = load_job(args.file)
    except JobFileError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT
    if _refused(args.file, layout_refusals(job)):  # a placement the runtime does not deliver is never planned
        return EXIT_BAD_INPUT
    try:
        overrides = _overrides(args.model_config)
        data_dir = data_dir_of(args)
        student_config, student_source = resolve_config("student.model", job.student.model, data_dir, overrides)
        judge_config, judge_source = None, None
        if job.judge is not None and not job.judge.share_student_base and job.judge.endpoint is None:
            judge_config, judge_source = resolve_config("judge.model", job.judge.model, data_dir, overrides)
        device = _device(args)
        devices = plan_devices(
            job, student_config, judge_config, device, prompt_tokens=_measured_prompt_tokens(job, args.file, data_dir)
        )
        plan = devices[0].plan  # student rank 0: the whole job on a single device
    except ApplianceError as exc:
        print(f"error: {args.file}: {exc}", file=sys.stderr)
        return exc.exit_code
    if _refused(args.file, layout_refusals(job, plan)):  # what `auto` resolved to on this device, held to the same
        return EXIT_BAD_INPUT
    if args.json:
        document = plan.to_dict()
        document["file"] = str(args.file)
        document["model_configs"] = {"student": student_source, "judge": judge_source}
        document["devices"] = [each.to_dict() for each in devices]
        document["fits"] = all(each.fits for each in devices)
        print(json.dumps(document, indent=2))
    else:
        print(f"{args.file}: job '{job.name}'")
        print(
            f"student {job.student.model} ({student_source})"
            + (f", judge {job.judge.model} ({judge_source or 'student base'})" if job.judge else "")
        )
        print(plan.render())
        if len(devices) > 1:
            print("\nper device:")
            print("\n".join(_device_line(each) for each in devices))
    problem = refusal(devices)
    if problem:
        if not args.json:
            print(f"error: {args.file}: does not fit: {problem}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


def _refused(file: Path, refusals: list[tuple[tuple[str, ...], str]]) -> bool:
    for key, why in refusals:
        print(f"{file}: {'.'.join(key)}: {why}", file=sys.stderr)
    return bool(refusals)


def _device_line(device) -> str:
    from appliance.config.sizes import format_bytes

    what = (
        f"student rank {device.rank} ({device.sharding})"
        if device.role == "student"
        else f"judge (TP {device.tensor_parallel}, batch {device.judge_batch})"
    )
    return (
        f"  node {device.node} device {device.index}: {what}: peak {format_bytes(device.peak_bytes)} of "
        f"{format_bytes(device.budget_bytes)}{'' if device.fits else '  DOES NOT FIT'}"
    )

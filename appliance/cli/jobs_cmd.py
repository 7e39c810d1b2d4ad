"""`appliance jobs ...`: the daemon's command-line client (over its Unix socket).

    appliance jobs submit FILE [--dry-run] | list | show ID | pause ID | resume ID | cancel ID | delete ID
                   | logs ID [--follow] | metrics ID | endpoint ID | submit-trajectories ID FILE
                                                              [--json] [--socket PATH]

Human tables by default, one JSON document with --json; either way every
control character the daemon sends is printed escaped (cli/safe_output.py). Exit codes: 0 ok,
1 the daemon is unreachable or failed, 2 bad input (job file errors, unknown
job, a state change the job does not allow), 3 the job does not fit the device.

`samples ID [--step N | --all]` prints recorded samples: completions, or agent
trajectories with their turns, tool calls and trained mask. Every action talks
over the daemon's Unix socket by default, or over its TCP control port (only
when the daemon was started with --control-addr) with `--control-addr
HOST:PORT --token-file FILE` or $APPLIANCE_CONTROL_ADDR and $APPLIANCE_TOKEN_FILE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FAILURE, EXIT_OK


def register(subparsers) -> None:
    jobs = subparsers.add_parser("jobs", help="submit and manage jobs on the daemon (appliance serve)")
    actions = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str, handler, with_id: bool = True):
        return _add_action(actions, name, help_text, handler, with_id)

    submit = action("submit", "validate, plan and queue a job file", _submit, with_id=False)
    submit.add_argument("file", type=Path, metavar="FILE")
    submit.add_argument("--dry-run", action="store_true", help="validate and plan only; queue nothing")
    action("list", "every job, oldest first", _list, with_id=False)
    action("show", "one job: state, events, plan, last step, checkpoints", _show)
    action("pause", "checkpoint and stop a job, freeing its device", _pause)
    action("resume", "queue a paused job again (it continues from its checkpoint)", _resume)
    action("cancel", "end a job for good", _cancel)
    action("delete", "remove a finished job: its record, folder and upload", _delete)
    logs = action("logs", "the job's log.txt", _logs)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing lines as they are written")
    logs.add_argument("--bytes", type=int, default=16384, help="how much of the end to show first (default 16384)")
    samples = action(
        "samples",
        "the job's recorded samples: completions, or agent trajectories with their turns, tool calls and trained mask",
        _samples,
    )
    samples.add_argument("--step", type=int, default=None, help="only this step (default: the newest recorded)")
    samples.add_argument("--all", action="store_true", help="every step still in the last --limit lines")
    samples.add_argument("--limit", type=int, default=400, help="how many of the newest lines to fetch (default 400)")
    action("metrics", "the job's per-step metrics", _metrics)
    action(
        "endpoint", "a running external-rollout job's student endpoint: URL, token and model for agent code", _endpoint
    )
    trajectories = action(
        "submit-trajectories", "submit trajectory groups played against the job's endpoint", _submit_trajectories
    )
    trajectories.add_argument(
        "file",
        type=Path,
        metavar="FILE",
        help='JSON: a list of trajectory groups (or {"groups": [...]}), or JSON Lines, one group per line',
    )


def _add_action(actions, name: str, help_text: str, handler, with_id: bool) -> object:
    """One `appliance jobs ACTION`: its job id, --json and how to reach the daemon."""
    parser = actions.add_parser(name, help=help_text)
    if with_id:
        parser.add_argument("job_id", metavar="ID")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument(
        "--socket",
        default=None,
        help="the daemon's socket (default: $APPLIANCE_SOCKET, else /run/appliance/control.sock)",
    )
    parser.add_argument(
        "--control-addr",
        default=None,
        metavar="HOST:PORT",
        help="talk to the daemon's TCP control port instead of the socket "
        "(default: $APPLIANCE_CONTROL_ADDR); needs --token-file",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the daemon's control token, mode 0600 (default: $APPLIANCE_TOKEN_FILE)",
    )
    parser.set_defaults(handler=lambda args: _run(args, handler))
    return parser


def _run(args, handler) -> int:
    from appliance.cli.safe_output import escaped_output

    with escaped_output():  # whatever the daemon sends, no control character reaches the terminal
        return _run_escaped(args, handler)


def _run_escaped(args, handler) -> int:
    from appliance.service.client import Client, ClientError, DaemonUnreachable
    from appliance.service.token_file import TokenFileError, read_token_file

    try:
        if args.control_addr and args.socket:
            raise ClientError("pass either --socket or --control-addr, not both", status=400)
        # An explicit --socket wins over $APPLIANCE_CONTROL_ADDR.
        control_addr = args.control_addr or (None if args.socket else os.environ.get("APPLIANCE_CONTROL_ADDR"))
        token_file = args.token_file or os.environ.get("APPLIANCE_TOKEN_FILE")
        token = read_token_file(token_file, "--token-file") if control_addr and token_file else None
        with Client(args.socket, control_addr=control_addr, token=token) as client:
            return handler(client, args)
    except TokenFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DaemonUnreachable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except ClientError as error:
        if args.json and error.response is not None:
            print(json.dumps(error.response.model_dump(), indent=2))
        for line in error.errors:
            print(line, file=sys.stderr)
        if not error.errors:
            print(f"error: {error}", file=sys.stderr)
        # The same exit codes as the local commands: 3 when the plan does not fit, 2 when the request was
        # wrong (4xx), 1 when the daemon failed.
        if error.status == 409 and error.plan is not None:
            return EXIT_DOES_NOT_FIT
        return EXIT_BAD_INPUT if error.status is not None and 400 <= error.status < 500 else EXIT_FAILURE


def _print_json(model) -> None:
    print(json.dumps(model.model_dump() if hasattr(model, "model_dump") else model, indent=2))


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _submit(client, args) -> int:
    response = client.submit(args.file, dry_run=args.dry_run)
    if args.json:
        _print_json(response)
    elif response.job is None:
        plan = response.plan
        print(
            f"{args.file}: valid; fits: peak {plan['peak_bytes'] / 2**30:.2f} GiB of a "
            f"{plan['budget_bytes'] / 2**30:.2f} GiB budget on {plan['device']['kind']} (dry run: nothing queued)"
        )
    else:
        print(f"submitted {response.job.id} ({response.job.name}): {response.job.state}")
    return EXIT_OK


def _list(client, args) -> int:
    jobs = client.jobs()
    if client.unreadable_jobs:
        print(f"({client.unreadable_jobs} jobs could not be read; another appliance version?)", file=sys.stderr)
    if args.json:
        print(json.dumps([job.model_dump() for job in jobs], indent=2))
        return EXIT_OK
    rows = [("ID", "NAME", "STATE", "STEP", "USER", "SUBMITTED", "REASON")]
    rows += [
        (
            job.id,
            job.name,
            job.state + (f" ({job.phase})" if job.phase else ""),
            f"{job.step}/{job.steps_total}",
            job.user,
            _when(job.created),
            job.reason.splitlines()[0] if job.reason else "",
        )
        for job in jobs
    ]
    # Every column padded to its widest cell but the reason, which is last and may be long.
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return EXIT_OK


def _show(client, args) -> int:
    job = client.job(args.job_id)
    if args.json:
        _print_json(job)
        return EXIT_OK
    print(
        f"job {job.id} '{job.name}': {job.state}{' (' + job.phase + ')' if job.phase else ''}, "
        f"step {job.step}/{job.steps_total}, submitted by {job.user} (uid {job.uid}) at {_when(job.created)}"
    )
    if job.reason:
        print(f"reason: {job.reason}")
    print(f"folder: {job.job_dir}")
    for event in job.events:
        data = event.data
        print(f"  {_when(event.time)}  {data.get('from') or '-'} -> {data.get('to')}: {data.get('reason', '')}")
    if job.last_record:
        record = job.last_record
        print(
            f"last step {record.get('step')}: reward {record.get('reward_mean', 0):+.3f}, loss {record.get('loss', 0):+.4f}"
        )
    if job.checkpoints:
        print(f"checkpoints: {', '.join(str(c.step) for c in job.checkpoints)}")
    if job.best:
        print(f"best: {json.dumps(job.best)}")
    return EXIT_OK


def _state_change(method):
    def handler(client, args) -> int:
        job = getattr(client, method)(args.job_id)
        if args.json:
            _print_json(job)
        else:
            print(f"{job.id}: {job.state}{' (' + job.reason + ')' if job.reason else ''}")
        return EXIT_OK

    return handler


_pause, _resume, _cancel = _state_change("pause"), _state_change("resume"), _state_change("cancel")


def _delete(client, args) -> int:
    deleted = client.delete(args.job_id)
    if args.json:
        _print_json(deleted)
    else:
        print(f"{deleted.job_id}: deleted ({deleted.freed_bytes / 2**20:.1f} MiB freed)")
    return EXIT_OK


def _logs(client, args) -> int:
    chunk = client.log(args.job_id, offset=-max(1, args.bytes))
    if args.json and not args.follow:
        _print_json(chunk)
        return EXIT_OK
    sys.stdout.write(chunk.text)
    sys.stdout.flush()
    if args.follow:
        for text in client.follow_log(args.job_id, start=chunk.next_offset):
            sys.stdout.write(text)
            sys.stdout.flush()
    return EXIT_OK


def _samples(client, args) -> int:
    from appliance.cli.samples_text import samples_text

    records = client.samples(args.job_id, limit=max(1, args.limit)).records
    steps = sorted({record.get("step") for record in records if isinstance(record.get("step"), int)})
    if args.step is not None:
        records = [record for record in records if record.get("step") == args.step]
    elif not args.all and steps:  # by default the newest step only: one step's groups read as a whole
        records = [record for record in records if record.get("step") == steps[-1]]
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        where = f" at step {args.step}" if args.step is not None else ""
        print(f"no samples recorded{where}" + (f" (recorded steps: {steps[0]}-{steps[-1]})" if steps else ""))
        return EXIT_OK
    print(samples_text(records), end="")
    return EXIT_OK


def _metrics(client, args) -> int:
    records = client.all_metrics(args.job_id)
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    print(f"{'STEP':>5}  {'REWARD':>8}  {'STD':>6}  {'LOSS':>9}  {'KL':>8}  {'TOK/S':>7}  {'SECONDS':>7}")
    for record in records:
        rate = record.get("tokens_per_second") or {}
        rate = rate.get("student", 0.0) if isinstance(rate, dict) else rate  # per engine; a number is the student's
        print(
            f"{record.get('step', 0):>5}  {record.get('reward_mean', 0):>+8.3f}  {record.get('reward_std', 0):>6.3f}  "
            f"{record.get('loss', 0):>+9.4f}  {record.get('kl', 0):>8.4f}  {rate:>7.1f}  "
            f"{(record.get('seconds') or {}).get('step', 0):>7.1f}"
        )
    return EXIT_OK


def _endpoint(client, args) -> int:
    endpoint = client.endpoint(args.job_id)
    if args.json:
        _print_json(endpoint)
        return EXIT_OK
    print(f"# job {endpoint.job_id}, model '{endpoint.model}' after step {endpoint.step}; valid while the job runs")
    print(f"OPENAI_BASE_URL={endpoint.url}")
    print(f"OPENAI_API_KEY={endpoint.token}")
    print(f"APPLIANCE_MODEL={endpoint.model}")
    return EXIT_OK


def _read_groups(path: Path) -> list:
    from appliance.service.client import ClientError

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ClientError(f"cannot read {path}: {error.strerror or error}", status=400) from error
    try:
        document = json.loads(text)
    except json.JSONDecodeError:  # not one JSON document: JSON Lines, one group per line
        groups = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                groups.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ClientError(
                    f"{path}:{number}: not JSON ({error.msg}); give a JSON list of trajectory groups"
                    " or JSON Lines, one group per line",
                    status=400,
                ) from None
        return groups
    if isinstance(document, dict) and "groups" in document:  # the API's own body shape
        document = document["groups"]
    if isinstance(document, dict):  # a single group
        document = [document]
    if not isinstance(document, list) or not document:
        raise ClientError(f"{path}: holds no trajectory groups; give a JSON list of groups", status=400)
    return document


def _submit_trajectories(client, args) -> int:
    accepted = client.submit_trajectories(args.job_id, _read_groups(args.file))
    if args.json:
        _print_json(accepted)
    else:
        print(
            f"{accepted.job_id}: {accepted.accepted} groups accepted ({accepted.queued} queued for training;"
            f" step {accepted.step})"
        )
        if accepted.unserved_messages_dropped:
            print(
                f"{accepted.unserved_messages_dropped} messages after the last served turn of their trajectories"
                " were left out: only what the endpoint served, and the context it was served after, is kept"
            )
    return EXIT_OK

"""`appliance serve`: the daemon systemd runs (job queue, workers, control API on a Unix socket, Prometheus)."""

from __future__ import annotations

import sys
from pathlib import Path

from appliance.cli.main import add_data_dir, data_dir_of, size_option


def register(subparsers) -> None:
    from appliance.service.api import DEFAULT_SOCKET

    parser = subparsers.add_parser(
        "serve",
        help="run the daemon: job queue, workers, control API on a Unix socket, Prometheus metrics",
        description="Run the appliance daemon. The Unix socket is the only control surface (mode 0660, "
        "group --group); Prometheus metrics are served read-only on --metrics-addr.",
    )
    add_data_dir(parser)
    _add_control_options(parser, DEFAULT_SOCKET)
    _add_submission_options(parser)
    _add_share_options(parser)
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long a pause or shutdown waits for a job to checkpoint before it is killed",
    )
    parser.set_defaults(handler=_serve)


def _add_control_options(parser, default_socket: Path) -> None:
    """Who may reach the daemon, and where: the socket, its groups, the metrics and TCP control ports."""
    parser.add_argument(
        "--socket", type=Path, default=None, help=f"control socket (default: $APPLIANCE_SOCKET, else {default_socket})"
    )
    parser.add_argument(
        "--group",
        default=None,
        help="group (a name or number) allowed to use the socket (default: 'appliance' when it exists, else the "
        "daemon's)",
    )
    parser.add_argument(
        "--admin-group",
        default=None,
        metavar="GROUP",
        help="members may pause, resume, cancel, export and take the endpoint of any job; others only their own "
        "(default: only root and each job's owner)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="Prometheus endpoint (default 127.0.0.1:9464)",
    )
    parser.add_argument(
        "--control-addr",
        default=None,
        metavar="HOST:PORT",
        help="also serve the control API on this TCP address (off by default); every request "
        "there needs the bearer token of --control-token-file",
    )
    parser.add_argument(
        "--control-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the TCP control port's token (mode 0600, at least 16 characters); "
        "required with --control-addr",
    )


def _add_submission_options(parser) -> None:
    """What a submitted job may read or reach: dataset and secret folders, judge servers, upload size."""
    parser.add_argument(
        "--dataset-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder the daemon may read datasets from (repeatable; default <data-dir>/datasets)",
    )
    parser.add_argument(
        "--secrets-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder judge.token_file may name a file in (repeatable; default <data-dir>/secrets)",
    )
    parser.add_argument(
        "--judge-endpoint",
        action="append",
        default=[],
        metavar="URL",
        help="a remote judge server jobs may use (repeatable; its scheme, host and port); none by default",
    )
    parser.add_argument(
        "--agent-endpoint-addr",
        default=None,
        metavar="HOST[:PORT[-PORT]]",
        help="where external-rollout jobs serve their student endpoint (default: loopback, any free port); "
        "e.g. 0.0.0.0:9500-9509 with --agent-endpoint-host to let agents on other hosts in",
    )
    parser.add_argument(
        "--agent-endpoint-host",
        default=None,
        metavar="NAME",
        help="the name other hosts reach this box by: the endpoint URL handed out uses it",
    )
    parser.add_argument(
        "--max-upload", default="64MiB", metavar="SIZE", help="largest dataset a submission may upload (default 64MiB)"
    )
    parser.add_argument(
        "--model-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder whose model folders jobs may name by path (repeatable); by default jobs name models in the "
        "model store only",
    )


def _add_share_options(parser) -> None:
    """Each user's fair share: caps per user and how long finished jobs are kept."""
    from appliance.service import fair_share

    parser.add_argument(
        "--max-queued-per-user",
        type=int,
        default=fair_share.DEFAULT_MAX_WAITING,
        metavar="N",
        help=f"jobs a user may have waiting: queued, paused or interrupted (default {fair_share.DEFAULT_MAX_WAITING}; "
        "0: no cap)",
    )
    parser.add_argument(
        "--max-jobs-per-user",
        type=int,
        default=fair_share.DEFAULT_MAX_JOBS,
        metavar="N",
        help=f"jobs a user may keep in any state, finished ones included (default {fair_share.DEFAULT_MAX_JOBS}; "
        "0: no cap); every member's job list holds them",
    )
    parser.add_argument(
        "--max-running-per-user",
        type=int,
        default=0,
        metavar="N",
        help="device slots a user's jobs may hold at once (default 0: no cap beyond the fair-share queue order)",
    )
    parser.add_argument(
        "--max-slot-hours",
        type=float,
        default=fair_share.DEFAULT_SLOT_SECONDS / 3600,
        metavar="HOURS",
        help=f"a running job holds its slots this long at most while another user's job waits, then checkpoints "
        f"and goes back to the queue (default {fair_share.DEFAULT_SLOT_SECONDS / 3600:g}; 0: until it ends)",
    )
    parser.add_argument(
        "--max-bytes-per-user",
        default="200GiB",
        metavar="SIZE",
        help="disk a user's job folders may hold before their submissions are refused (default 200GiB; 0: no cap)",
    )
    parser.add_argument(
        "--retention-days",
        type=float,
        default=fair_share.DEFAULT_RETENTION_SECONDS / 86_400,
        metavar="DAYS",
        help="finished jobs (succeeded, failed, cancelled) are deleted this long after they ended (default 0: kept "
        "until deleted with 'appliance jobs delete')",
    )
    parser.add_argument(
        "--external-idle-timeout",
        type=float,
        default=fair_share.DEFAULT_EXTERNAL_IDLE_SECONDS,
        metavar="SECONDS",
        help="an external-rollout job that receives no trajectory group for this long ends, with that reason "
        "(default 3600; 0: waits for ever)",
    )


def _serve(args) -> int:
    from appliance.agents.endpoint_bind import parse_bind
    from appliance.errors import ApplianceError
    from appliance.metrics.scrape_server import parse_metrics_addr
    from appliance.service.client import default_socket
    from appliance.service.daemon import DaemonOptions
    from appliance.service.fair_share import Quotas
    from appliance.service.server import run_daemon

    try:
        host, port = parse_metrics_addr(args.metrics_addr)
        control_addr = _control_addr(args.control_addr) if args.control_addr else None
        max_upload = size_option("--max-upload", args.max_upload)
        quotas = Quotas(
            max_waiting=_not_negative("--max-queued-per-user", args.max_queued_per_user),
            max_running=_not_negative("--max-running-per-user", args.max_running_per_user),
            max_jobs=_not_negative("--max-jobs-per-user", args.max_jobs_per_user),
            slot_seconds=_not_negative("--max-slot-hours", args.max_slot_hours) * 3600,
            max_bytes=size_option("--max-bytes-per-user", args.max_bytes_per_user),
            retention_seconds=_not_negative("--retention-days", args.retention_days) * 86_400,
            external_idle_seconds=_not_negative("--external-idle-timeout", args.external_idle_timeout),
        )
        options = DaemonOptions(
            data_dir=data_dir_of(args),
            dataset_roots=tuple(args.dataset_root),
            secrets_roots=tuple(args.secrets_root),
            judge_endpoints=tuple(args.judge_endpoint),
            model_roots=tuple(args.model_root),
            quotas=quotas,
            max_upload_bytes=max_upload,
            stop_timeout=args.stop_timeout,
            agent_endpoint=parse_bind(args.agent_endpoint_addr, args.agent_endpoint_host),
        )
        return run_daemon(
            options,
            args.socket or Path(default_socket()),
            args.group,
            host,
            port,
            control_addr=control_addr,
            control_token_file=args.control_token_file,
            admin_group=args.admin_group,
        )
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


def _not_negative(option: str, value):
    from appliance.errors import UsageError

    if value < 0:
        raise UsageError(f"{option} {value} is negative; give 0 (no limit) or more")
    return value


def _control_addr(text: str) -> tuple[str, int]:
    from appliance.errors import UsageError

    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise UsageError(f"--control-addr '{text}' is not HOST:PORT with a port 1-65535; for example 127.0.0.1:9470")
    return host.strip("[]"), int(port)

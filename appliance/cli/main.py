"""The `appliance` command: one subcommand module per concern, registered here.

Each module in COMMANDS exposes `register(subparsers)`; the parser it adds
carries a `handler(args) -> int` default. Exit codes: 0 ok, 1 runtime failure,
2 bad input (job file, arguments), 3 the job does not fit the memory budget.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import importlib
import sys

from appliance import __version__
from appliance.paths import default_data_dir

# Imported by name as the parser is built: each module keeps its heavy imports inside its handler, so
# `appliance --help` loads no torch. The order is the order of `appliance --help`.
COMMANDS = [
    "appliance.cli.config_cmd",
    "appliance.cli.models_cmd",
    "appliance.cli.plan_cmd",
    "appliance.cli.train_cmd",
    "appliance.cli.eval_cmd",
    "appliance.cli.export_cmd",
    "appliance.cli.serve_cmd",
    "appliance.cli.jobs_cmd",
    "appliance.cli.judge_cmd",
    "appliance.cli.bundle_cmd",
]

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT = 0, 1, 2, 3


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help="state directory (default: $APPLIANCE_DATA_DIR, else /var/lib/appliance if writable, else ./.appliance)",
    )


def data_dir_of(args: argparse.Namespace):
    from pathlib import Path

    return Path(args.data_dir) if getattr(args, "data_dir", None) else default_data_dir()


def size_option(option: str, text: str) -> int:
    """A size option in bytes ('64MiB' -> 67108864), or a UsageError naming the option.

    parse_bytes stays a ValueError-raising value parser: the job file's pydantic validators use it too.
    """
    from appliance.config.sizes import parse_bytes
    from appliance.errors import UsageError

    try:
        return parse_bytes(text)
    except ValueError as error:
        raise UsageError(f"{option}: {error}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description="On-premise GRPO training appliance.")
    parser.add_argument("--version", action="version", version=f"appliance {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] in ("appliance", "tui"):
            raise  # our own module missing: a broken install, keep the traceback
        print(needs_training_stack(args.command, error.name), file=sys.stderr)
        return EXIT_FAILURE


def needs_training_stack(command: str, missing: str | None) -> str:
    """One line for a command run where only the client (`appliance jobs`, `appliance-tui`) is installed."""
    return (
        f"error: 'appliance {command}' needs the training stack ({missing} is not installed here: this is the "
        "client); run it on the box, where `sudo appliance ...` runs it in the appliance container, or where "
        "appliance[cpu] or appliance[gpu] is installed (make venv in a checkout)"
    )


if __name__ == "__main__":
    sys.exit(main())

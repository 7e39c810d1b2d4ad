"""`appliance config check FILE...`: validate job files, every error at once.

Exit 0 when every file is valid, else 2 with each error on stderr as
`FILE:LINE:KEY: message` (or one JSON document on stdout with `--json`).
`--limits` prints the upper bound of every key instead (config/limits.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_OK, add_data_dir, data_dir_of


def register(subparsers) -> None:
    config = subparsers.add_parser("config", help="job files")
    actions = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate job files against the schema, the model store, datasets and rewards",
        description="Validate job files. Exit 0 when all are valid, else 2 with every error as FILE:LINE:KEY: message.",
    )
    check.add_argument("files", nargs="*", type=Path, metavar="FILE")
    check.add_argument(
        "--limits",
        action="store_true",
        help="print the upper bound of every number, list, string and mapping of a job file (and the file's size)",
    )
    check.add_argument(
        "--no-model-check",
        action="store_true",
        help="do not look for the models in the model store or on disk (for files written for another box)",
    )
    check.add_argument("--json", action="store_true", help="one JSON document with per-file errors on stdout")
    add_data_dir(check)
    check.set_defaults(handler=_check, parser=check)


def _limits(args) -> int:
    from appliance.config.limits import limits_table, table_text

    rows = limits_table()
    if args.json:
        print(json.dumps([{"key": r.key, "kind": r.kind, "low": r.low, "high": r.high} for r in rows], indent=2))
    else:
        print(table_text(rows), end="")
    return EXIT_OK


def _check(args) -> int:
    from appliance.job_checks import check_job_file

    if args.limits:
        return _limits(args)
    if not args.files:
        args.parser.error("name at least one job FILE to check (or pass --limits)")  # exits 2, with the usage
    data_dir = data_dir_of(args)
    results = []
    for file in args.files:
        spec, errors = check_job_file(file, data_dir, check_models=not args.no_model_check)
        results.append((file, spec, errors))
    all_valid = all(not errors for _, _, errors in results)
    if args.json:
        print(
            json.dumps(
                {
                    "valid": all_valid,
                    "files": [
                        {
                            "file": str(file),
                            "valid": not errors,
                            "name": spec.name if spec else None,
                            "errors": [error.as_dict() for error in errors],
                        }
                        for file, spec, errors in results
                    ],
                },
                indent=2,
            )
        )
    else:
        for file, spec, errors in results:
            if errors:
                for error in errors:
                    print(error, file=sys.stderr)
            else:
                print(f"{file}: ok ({spec.name})")
    return EXIT_OK if all_valid else EXIT_BAD_INPUT

"""`appliance export JOB [--checkpoint best|latest|step-N] --out DIR [--merged]`: a trained adapter, ready to use.

JOB is a job folder, or a job name (foreground runs) or id (daemon runs) under
the data dir. `--check DIR` verifies an earlier export against its manifest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, add_data_dir, data_dir_of


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a job's adapter (or a merged model) with a manifest and a model card",
        description="Export a job's adapter, or the base model merged with it, with export.json (source, base "
        "model sha256, file hashes) and a model card. --check DIR verifies an export.",
    )
    parser.add_argument("job", nargs="?", help="job folder, or a job name or id under the data dir")
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or step-N")
    parser.add_argument("--out", type=Path, help="folder to create (must not exist or be empty)")
    parser.add_argument(
        "--merged",
        action="store_true",
        help="merge the LoRA into the base's original weights (a plain transformers/vLLM model)",
    )
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="weights dtype of a merged export (default bfloat16)",
    )
    parser.add_argument("--check", type=Path, metavar="DIR", help="verify an exported folder against its manifest")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_data_dir(parser)
    parser.set_defaults(handler=_export)


def _export(args) -> int:
    from appliance.export import ExportError, export_job, verify_export

    if args.check:
        try:
            manifest = verify_export(args.check)
        except ExportError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_FAILURE
        if args.json:
            print(json.dumps({"path": str(args.check), "ok": True, "manifest": manifest}, indent=2))
        else:
            print(
                f"{args.check}: {len(manifest['files'])} files match export.json "
                f"(job {manifest['source']['job']}, step {manifest['source']['step']})"
            )
        return EXIT_OK
    if not args.job or not args.out:
        print("error: give JOB and --out DIR (or --check DIR to verify an export)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result = export_job(
            args.job, data_dir_of(args), args.out, checkpoint=args.checkpoint, merged=args.merged, dtype=args.dtype
        )
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(result.path),
                    "kind": result.kind,
                    "job": result.job,
                    "step": result.step,
                    "manifest": result.manifest,
                },
                indent=2,
            )
        )
    else:
        print(
            f"exported {result.kind} of '{result.job}' at step {result.step} to {result.path} "
            f"({len(result.manifest['files'])} files, manifest export.json)"
        )
    return EXIT_OK

"""`appliance models list | import DIR --name N | provision-demo`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_OK, add_data_dir, data_dir_of
from appliance.config.sizes import format_bytes
from appliance.models.store import ModelStore, ModelStoreError


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="the local model store")
    actions = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="models in the store with their hash status")
    listing.add_argument("--json", action="store_true")
    add_data_dir(listing)
    listing.set_defaults(handler=_list)

    importing = actions.add_parser("import", help="import a Hugging Face model folder")
    importing.add_argument("folder", type=Path)
    importing.add_argument("--name", required=True)
    add_data_dir(importing)
    importing.set_defaults(handler=_import)

    demo = actions.add_parser("provision-demo", help="convert the bundled SmolLM2-135M-Instruct into the store")
    add_data_dir(demo)
    demo.set_defaults(handler=_provision_demo)


def _list(args) -> int:
    store = ModelStore(data_dir_of(args))
    rows = []
    for name in store.names():
        model = store.get(name)
        rows.append(
            {
                "name": name,
                "architecture": model.architecture,
                "parameters": model.parameters,
                "size_bytes": model.size_bytes,
                "dtype": model.manifest.get("dtype"),
                "status": store.check_status(name),
                "path": str(model.path),
            }
        )
    if args.json:
        print(json.dumps({"models": rows}, indent=2))
        return EXIT_OK
    if not rows:
        print(f"no models in {store.root}; run 'appliance models provision-demo'")
        return EXIT_OK
    print(f"{'NAME':<28} {'ARCHITECTURE':<22} {'PARAMS':>10} {'SIZE':>11}  STATUS")
    for row in rows:
        print(
            f"{row['name']:<28} {row['architecture']:<22} {row['parameters'] / 1e6:>9.1f}M "
            f"{format_bytes(row['size_bytes']):>11}  {row['status']}"
        )
    return EXIT_OK


def _import(args) -> int:
    try:
        model = ModelStore(data_dir_of(args)).import_folder(args.folder, args.name)
    except ModelStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"imported '{model.name}' ({model.architecture}, {model.parameters / 1e6:.1f}M parameters) into {model.path}")
    return EXIT_OK


def _provision_demo(args) -> int:
    from appliance.models.provision import provision_demo

    started = time.monotonic()
    try:
        model, created = provision_demo(data_dir_of(args))
    except ModelStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    verb = "provisioned" if created else "already provisioned"
    print(f"{verb} '{model.name}' at {model.path} ({time.monotonic() - started:.1f} s)")
    return EXIT_OK

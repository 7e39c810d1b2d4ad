"""`appliance bundle verify DIR | install DIR | rollback | uninstall | status`: the bundle on the box, as root.

`verify` checks a bundle before any of its code runs (appliance/bundle/verify.py) and leaves the marker
install-bundle asks for. `install` installs a verified bundle, or upgrades to it: the running jobs are
paused at their step's end, the image and models are swapped beside the old ones, every paused job resumes.
`rollback` returns to the release before, `uninstall` removes units and images and keeps the data unless
--purge. Exit 0 ok, 1 refused or failed (one sentence on stderr), 2 bad arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path

from appliance.cli.main import EXIT_FAILURE, EXIT_OK


def register(subparsers) -> None:
    from appliance.bundle.verify import DEFAULT_KEYRING, DEFAULT_STATE_DIR

    bundle = subparsers.add_parser("bundle", help="verify, install, upgrade, roll back or uninstall (on the box)")
    actions = bundle.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str, handler):
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument(
            "--state-dir",
            type=Path,
            default=DEFAULT_STATE_DIR,
            help=f"the install records: marker, releases (default {DEFAULT_STATE_DIR})",
        )
        parser.set_defaults(handler=lambda args: _run(handler, args))
        return parser

    verify = action("verify", "check a bundle's signature and every file before any of it runs", _verify)
    verify.add_argument("bundle", type=Path, metavar="DIR")
    verify.add_argument("--keyring", type=Path, default=DEFAULT_KEYRING, help=f"public key (default {DEFAULT_KEYRING})")
    install = action("install", "install a verified bundle, or upgrade to it (drain, swap, resume every job)", _install)
    install.add_argument("bundle", type=Path, metavar="DIR")
    install.add_argument(
        "--runtime",
        choices=("podman", "podman-classic", "docker"),
        default=None,
        help="podman: the Quadlet unit (Podman >= 5); podman-classic: a classic unit running podman (Podman 4.x); "
        "docker (default: podman when installed, classic on Podman < 5, else docker)",
    )
    install.add_argument(
        "--device",
        choices=("gpu", "cpu"),
        default=None,
        help="cpu: a unit that asks for no GPU (default: gpu when the NVIDIA driver is loaded)",
    )
    install.add_argument("--drain-timeout", type=float, default=900.0, help="seconds to wait for running jobs to pause")
    install.add_argument("--dry-run", action="store_true", help="check the bundle and the box; change nothing")
    install.add_argument(
        "--downgrade",
        action="store_true",
        help="install a release older than the one in use (refused without it: an old bundle replayed as an upgrade)",
    )
    rollback = action("rollback", "return to the release before, every job kept (drain, swap, resume)", _rollback)
    rollback.add_argument("--drain-timeout", type=float, default=900.0)
    rollback.add_argument("--dry-run", action="store_true")
    uninstall = action("uninstall", "remove units, shim and images; keep the data unless --purge", _uninstall)
    uninstall.add_argument("--purge", action="store_true", help="also delete /var/lib/appliance and the models")
    action("status", "the release in use and the one a rollback returns to", _status)


def _run(handler, args) -> int:
    from appliance.errors import ApplianceError

    try:
        return handler(args)
    except ApplianceError as error:
        print(f"appliance bundle {args.bundle_command}: {error}", file=sys.stderr)
        return error.exit_code
    except OSError as error:  # a full disk, an I/O error, a path that is not a folder: one line, never a traceback
        print(f"appliance bundle {args.bundle_command}: {os_failure(error)}", file=sys.stderr)
        return EXIT_FAILURE


def os_failure(error: OSError) -> str:
    """What failed on which file, and where to look: the step stopped there and can be run again."""
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    return (
        f"{where or 'a file'}: {error.strerror or error} (errno {error.errno}); nothing after this step ran: "
        "free space or fix that path, then run the same command again ('appliance bundle status' shows the release "
        "in use)"
    )


def _verify(args) -> int:
    from appliance.bundle.verify import verify_bundle

    verified = verify_bundle(args.bundle, args.keyring, args.state_dir)
    print(
        f"verified {verified.bundle}: signature of MANIFEST.sha256 under {args.keyring}, "
        f"{verified.files} files ({verified.bytes / 2**20:.0f} MiB), no link, device or unlisted entry; "
        f"marker {args.state_dir / 'verified'} (manifest sha256 {verified.manifest_sha256[:16]}...)"
    )
    return EXIT_OK


def _options(args):
    from appliance.bundle.lifecycle import Options

    return Options(
        state_dir=args.state_dir,
        runtime=getattr(args, "runtime", None),
        device=getattr(args, "device", None),
        drain_timeout=getattr(args, "drain_timeout", 900.0),
        dry_run=getattr(args, "dry_run", False),
        downgrade=getattr(args, "downgrade", False),
    )


def _install(args) -> int:
    from appliance.bundle.lifecycle import install

    install(args.bundle, _options(args))
    return EXIT_OK


def _rollback(args) -> int:
    from appliance.bundle.lifecycle import rollback

    rollback(_options(args))
    return EXIT_OK


def _uninstall(args) -> int:
    from appliance.bundle.lifecycle import uninstall

    uninstall(_options(args), purge=args.purge)
    return EXIT_OK


def _status(args) -> int:
    from appliance.bundle.drain import pending
    from appliance.bundle.lifecycle import current, interrupted, previous

    now, before = current(args.state_dir), previous(args.state_dir)
    print(f"in use: {now.version + ' (' + now.image + ', ' + now.runtime + ', ' + now.device + ')' if now else 'none'}")
    unfinished = interrupted(args.state_dir)
    back = now if unfinished is not None and now is not None else before  # an unfinished swap is undone first
    print(f"rollback returns to: {back.version if back else 'nothing recorded'}")
    if unfinished is not None:
        print(
            f"the swap to {unfinished[0]} did not finish (stopped half-way): run its install again to finish it"
            + (f", or 'appliance bundle rollback' to return to {now.version}" if now else "")
        )
    held = pending(args.state_dir)
    if held:
        print(
            f"paused by an upgrade or rollback that did not finish: {' '.join(held)}; run it again (it resumes them), "
            "or resume each: appliance jobs resume ID"
        )
    return EXIT_OK

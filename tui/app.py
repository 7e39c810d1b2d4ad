"""Entry point of `appliance-tui`.

The operator client speaks only to the daemon's control API (DESIGN.md). The
daemon (`appliance serve`) is not built yet, so for now the command says so
and points at the foreground tools instead of pretending to connect.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_SOCKET = "/run/appliance/control.sock"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="appliance-tui", description="Operator client for the appliance daemon.")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help="the daemon's control socket")
    parser.parse_args(argv)
    print("error: the appliance daemon and its control API are not available in this version; "
          "run jobs with 'appliance train FILE' and watch them with 'appliance train FILE --metrics-addr HOST:PORT'",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

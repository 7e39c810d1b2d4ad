"""`<job>/endpoint.json`: where a running external-rollout job serves its student, and the token it asks for.

The worker writes it (owner-only, 0600) when its endpoint accepts. When the
job stops serving (it ends, pauses, or the daemon stops) the file stays with
the token and the last address but no `url`, so the daemon answers "not
serving" while a restarted worker of the same job serves again with the same
token, on the same port when that port is free. A new job (a new folder) gets
a new token. Standard library only, so the daemon can read it without
loading an engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from appliance.agents.private_files import write_private

ENDPOINT_FILE = "endpoint.json"
SUBMIT_ROUTE = "/appliance/trajectories"  # beside /v1 on the endpoint: where submitted groups are checked
MIN_TOKEN_LENGTH = 32  # a kept token shorter than this (a hand-edited file) is replaced


@dataclass(frozen=True)
class PreviousEndpoint:
    """What an earlier worker of the same job served with: its token and port (None when unknown)."""

    token: str | None
    port: int | None


def write_endpoint(job_dir: Path, document: dict) -> None:
    """Write the endpoint document (it holds the token: 0600, atomically)."""
    write_private(Path(job_dir) / ENDPOINT_FILE, json.dumps(document))


def _read(job_dir: Path) -> dict | None:
    try:
        document = json.loads((Path(job_dir) / ENDPOINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def read_endpoint_file(job_dir: Path) -> dict | None:
    """The endpoint a running external job serves ({url, token, model, pid}), or None when it serves none."""
    document = _read(job_dir)
    return document if document is not None and {"url", "token", "model"} <= document.keys() else None


def previous_endpoint(job_dir: Path) -> PreviousEndpoint:
    """The token and port an earlier worker of this job served with, whether it ended cleanly or not."""
    document = _read(job_dir) or {}
    token = document.get("token")
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        token = None
    address = document.get("url") or document.get("last_url")  # "url" too: a worker that crashed left it
    try:
        port = urlsplit(address).port if isinstance(address, str) else None
    except ValueError:
        port = None
    return PreviousEndpoint(token, port)

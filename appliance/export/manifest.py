"""The export manifest, `export.json`: where an export came from and the sha256 of every file in it.

It names the source job, the checkpoint and its step and metric, the base
model with the sha256 of its files (from the model store's own manifest, so
a lab can check it holds the same base), and size and sha256 of every
exported file, so that an altered, missing or added file is caught by
`verify_export` before the model is used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from appliance.errors import ExportError
from appliance.durable import write_atomically
from appliance.models.store import file_table, sha256_file

EXPORT_MANIFEST = "export.json"
EXPORT_SCHEMA = 1


def tree_digest(files: dict[str, dict]) -> str:
    """One sha256 for a whole model folder: over the sorted 'name sha256' lines of its file table."""
    lines = "".join(f"{name} {entry['sha256']}\n" for name, entry in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def write_export_manifest(folder: Path, description: dict) -> dict:
    """Hash every file in `folder` (the manifest itself excepted) and write export.json atomically."""
    manifest = {"schema": EXPORT_SCHEMA, **description, "files": file_table(folder, skip=(EXPORT_MANIFEST,))}
    write_atomically(Path(folder) / EXPORT_MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_export_manifest(folder: Path) -> dict:
    path = Path(folder) / EXPORT_MANIFEST
    if not path.is_file():
        raise ExportError(f"{folder} has no {EXPORT_MANIFEST}; it is not an appliance export (or it was not finished)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ExportError(f"{path} is not valid JSON ({error}); export the job again") from None
    if manifest.get("schema") != EXPORT_SCHEMA or not isinstance(manifest.get("files"), dict):
        raise ExportError(f"{path} has schema {manifest.get('schema')!r}; this appliance reads schema {EXPORT_SCHEMA}")
    return manifest


def verify_export(folder: Path) -> dict:
    """The manifest, after checking every file: raises ExportError naming each missing, changed or unlisted file."""
    folder = Path(folder)
    manifest = read_export_manifest(folder)
    problems = []
    for name, expected in sorted(manifest["files"].items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
            problems.append(f"{path} was changed (size or sha256 differs from {EXPORT_MANIFEST})")
    # Added files count too: an export with a stray file is not the export the manifest describes.
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != EXPORT_MANIFEST and path.name not in manifest["files"]:
            problems.append(f"{path} is not listed in {EXPORT_MANIFEST}")
    if problems:
        raise ExportError(
            f"export {folder} does not match its manifest: "
            + "; ".join(problems)
            + "; export the job again from its job folder"
        )
    return manifest

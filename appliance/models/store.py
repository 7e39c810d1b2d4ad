"""The local model store: `<data-dir>/models/<name>/` HF folders with a manifest.

A manifest records the architecture, parameter count, dtype and the size and
sha256 of every file, so that a model that was altered or half-copied is
caught before it is loaded. Models are only ever read from local paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.durable import write_atomically
from appliance.errors import ApplianceError
from appliance.paths import models_dir

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
# What a Hugging Face model folder needs: weights, configs and tokenizer files, chat templates, remote code.
# Anything else (a .bin checkpoint, a README, optimizer state) is left behind on import.
MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".py")


class ModelStoreError(ApplianceError):
    """A model is missing, incomplete or altered; the message says which file and what to do."""


@dataclass(frozen=True)
class StoredModel:
    name: str
    path: Path
    manifest: dict

    @property
    def architecture(self) -> str:
        return self.manifest.get("architecture", "?")

    @property
    def parameters(self) -> int:
        return int(self.manifest.get("parameters", 0))

    @property
    def size_bytes(self) -> int:
        return sum(entry["bytes"] for entry in self.manifest.get("files", {}).values())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):  # in blocks: a shard can be larger than memory
            digest.update(block)
    return digest.hexdigest()


def file_table(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """{file name: {bytes, sha256}} for every file directly in `folder` except `skip`."""
    return {
        path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(Path(folder).iterdir())
        if path.is_file() and path.name not in skip
    }


def _count_parameters(folder: Path) -> tuple[int, str]:
    """Parameters and dtype from safetensors headers alone (no tensor is loaded)."""
    from safetensors import safe_open

    total, dtypes = 0, set()
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for key in handle.keys():
                piece = handle.get_slice(key)
                count = 1
                for dim in piece.get_shape():
                    count *= dim
                total += count
                dtypes.add(piece.get_dtype())
    return total, ",".join(sorted(dtypes)) or "?"


def write_manifest(folder: Path, source: str) -> dict:
    """Hash every model file in `folder` and write manifest.json atomically."""
    config = json.loads((folder / "config.json").read_text())
    files = file_table(folder, skip=(MANIFEST,))
    parameters, dtype = _count_parameters(folder)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "architecture": (config.get("architectures") or [config.get("model_type", "?")])[0],
        "model_type": config.get("model_type"),
        "parameters": parameters,
        "dtype": dtype,
        "source": source,
        "files": files,
    }
    write_atomically(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


class ModelStore:
    """Models under `<data-dir>/models`, or `$APPLIANCE_MODELS_DIR` (the image's read-only /models)."""

    def __init__(self, data_dir: Path):
        self.root = models_dir(Path(data_dir))

    def path_of(self, name: str) -> Path:
        return self.root / name

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        # A folder without a manifest is an import in progress (a hidden staging folder) or not ours.
        return sorted(p.name for p in self.root.iterdir() if (p / MANIFEST).is_file())

    def get(self, name: str) -> StoredModel:
        folder = self.path_of(name)
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file():
            known = ", ".join(self.names()) or "none"
            raise ModelStoreError(
                f"model '{name}' is not in the store at {self.root} (known: {known}); "
                "run 'appliance models provision-demo' or 'appliance models import DIR --name NAME'"
            )
        return StoredModel(name, folder, json.loads(manifest_path.read_text()))

    def verify(self, name: str) -> StoredModel:
        """Check every file against the manifest; raise naming the first bad file."""
        model = self.get(name)
        for file_name, expected in model.manifest["files"].items():
            path = model.path / file_name
            if not path.is_file():
                raise ModelStoreError(
                    f"model '{name}': file {path} listed in its manifest is missing; re-import the model"
                )
            # Size first: a half-copied file is caught without hashing it.
            if path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
                raise ModelStoreError(
                    f"model '{name}': file {path} does not match its manifest (altered or partly copied); re-import the model"
                )
        return model

    def check_status(self, name: str) -> str:
        try:
            self.verify(name)
            return "ok"
        except ModelStoreError as exc:
            return f"bad: {exc}"

    def import_folder(self, source: Path, name: str) -> StoredModel:
        """Copy an HF causal-LM folder into the store and write its manifest."""
        source = Path(source)
        validate_hf_folder(source)
        target = self.path_of(name)
        if (target / MANIFEST).is_file():
            raise ModelStoreError(
                f"model '{name}' already exists in the store; choose another --name or remove {target}"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        # Copied into a hidden folder beside the target and renamed into place: a model is in the store whole
        # (with its manifest) or not at all.
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{name}."))
        try:
            for path in source.iterdir():
                if path.is_file() and path.name != MANIFEST and path.suffix in MODEL_FILE_SUFFIXES:
                    shutil.copy2(path, staging / path.name)
            write_manifest(staging, source=str(source))
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self.get(name)


def validate_hf_folder(folder: Path) -> None:
    """A folder we can load as a causal LM: config, tokenizer, safetensors weights."""
    if not folder.is_dir():
        raise ModelStoreError(f"{folder} is not a directory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelStoreError(f"{folder} has no config.json; point at a Hugging Face model folder")
    if not list(folder.glob("*.safetensors")):
        raise ModelStoreError(f"{folder} has no *.safetensors weights; convert .bin weights to safetensors first")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ModelStoreError(f"{folder} has no tokenizer.json or tokenizer.model")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad config
        raise ModelStoreError(f"{config_path} cannot be read as a model config: {exc}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelStoreError(f"{config_path}: model_type '{config.model_type}' is not a causal language model")


def resolve_model(reference: str, data_dir: Path, verify: bool = True) -> Path:
    """A job's `model:` value (a store name or a folder path) -> a local folder."""
    as_path = Path(reference).expanduser()
    if "/" in reference or as_path.is_dir():  # a path, not a store name (names hold no slash)
        if not (as_path / "config.json").is_file():
            raise ModelStoreError(f"model path {as_path} has no config.json")
        return as_path
    store = ModelStore(data_dir)
    return (store.verify(reference) if verify else store.get(reference)).path

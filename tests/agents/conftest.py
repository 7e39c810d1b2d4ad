"""Fixtures for the agent tests: the bundled model's real tokenizer (no weights loaded), a tiny engine."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(demo_model_dir):
    from appliance.models.loading import load_tokenizer

    return load_tokenizer(demo_model_dir)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """A transformers engine over the tiny random Llama (tests/conftest.py), on the CPU."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(tiny_model_dir, device="cpu")
    yield engine
    engine.close()

"""Fixtures for the agent tests: the bundled model's real tokenizer (no weights loaded)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(demo_model_dir):
    from appliance.models.causal_lm import load_tokenizer

    return load_tokenizer(demo_model_dir)

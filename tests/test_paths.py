"""Where state and models live: the data dir default and the model store's location."""

from __future__ import annotations

from pathlib import Path

from appliance.models.provision import DEMO_MODEL_NAME
from appliance.models.store import ModelStore
from appliance.paths import models_dir


def test_models_live_under_the_data_dir_by_default(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("APPLIANCE_MODELS_DIR", raising=False)

    assert models_dir(tmp_path) == tmp_path / "models"


def test_the_image_points_the_store_at_a_separate_read_only_folder(monkeypatch, tmp_path: Path, store_data_dir: Path):
    # The container mounts the store at /models and keeps state in /var/lib/appliance.
    monkeypatch.setenv("APPLIANCE_MODELS_DIR", str(store_data_dir / "models"))
    empty_state = tmp_path / "state"

    store = ModelStore(empty_state)

    assert store.root == store_data_dir / "models"
    assert DEMO_MODEL_NAME in store.names()
    assert store.verify(DEMO_MODEL_NAME).path == store_data_dir / "models" / DEMO_MODEL_NAME

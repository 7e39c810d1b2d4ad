"""Where state and models live: the data dir default and the model store's location."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from daemon_support import Daemon, daemon_env, free_port, short_tmp_dir

from appliance import paths
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


# ----- the data dir is this user's, and owner/group-only -------------------------------------------

NOBODY = 65534


def someone_elses(folder: Path) -> Path:
    folder.mkdir(parents=True)
    os.chown(folder, NOBODY, NOBODY)
    return folder


@pytest.fixture
def no_system_dir(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("APPLIANCE_DATA_DIR", raising=False)
    monkeypatch.setattr(paths, "SYSTEM_DATA_DIR", tmp_path / "no-var-lib-appliance")
    monkeypatch.chdir(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_data_dir_another_user_owns_is_refused(tmp_path: Path):
    theirs = someone_elses(tmp_path / "theirs")
    with pytest.raises(paths.DataDirError, match=r"theirs belongs to .*uid 65534.*pass --data-dir"):
        paths.own_data_dir(theirs)
    os.symlink(theirs, tmp_path / "link")  # a link is judged by where it leads
    with pytest.raises(paths.DataDirError, match="uid 65534"):
        paths.own_data_dir(tmp_path / "link")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_the_dot_appliance_fallback_made_by_another_user_is_refused(no_system_dir, tmp_path: Path):
    someone_elses(tmp_path / ".appliance")
    with pytest.raises(paths.DataDirError, match=r"\.appliance belongs to .*uid 65534"):
        paths.default_data_dir()
    (tmp_path / ".appliance").rmdir()
    os.symlink(someone_elses(tmp_path / "planted"), tmp_path / ".appliance")
    with pytest.raises(paths.DataDirError, match="uid 65534"):
        paths.default_data_dir()


def test_the_dot_appliance_fallback_of_this_user_is_used(no_system_dir, tmp_path: Path):
    assert paths.default_data_dir() == Path(".appliance")  # not there yet: the daemon creates it
    (tmp_path / ".appliance").mkdir()
    assert paths.default_data_dir() == Path(".appliance")
    (tmp_path / ".appliance").rmdir()
    (tmp_path / ".appliance").write_text("")
    with pytest.raises(paths.DataDirError, match="is not a folder"):
        paths.default_data_dir()


def test_an_old_world_readable_data_dir_is_closed_to_others(tmp_path: Path):
    old = tmp_path / "old"
    old.mkdir(mode=0o777)
    os.chmod(old, 0o777)
    assert stat.S_IMODE(paths.own_data_dir(old).stat().st_mode) == 0o770
    assert stat.S_IMODE(paths.own_data_dir(tmp_path / "new" / "data").stat().st_mode) == 0o750


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_the_daemon_refuses_a_data_dir_another_user_owns(tmp_path: Path):
    theirs = someone_elses(tmp_path / "theirs")
    folder = short_tmp_dir()
    daemon = Daemon(theirs, folder / "control.sock", free_port(), tmp_path / "daemon.log", [], daemon_env())
    try:
        daemon.start(wait=False)
        assert daemon.proc.wait(60) == 2
        assert f"the data dir {theirs} belongs to nobody (uid 65534)" in daemon.log()
        assert list(theirs.iterdir()) == []  # nothing was created in it
    finally:
        daemon.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_daemon_keeps_its_state_owner_and_group_only(tmp_path: Path):
    folder = short_tmp_dir()
    data = tmp_path / "data"
    daemon = Daemon(data, folder / "control.sock", free_port(), tmp_path / "daemon.log", [], daemon_env())
    try:
        daemon.start()
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in [data, *data.iterdir()]}
    finally:
        daemon.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert {name: mode for name, mode in modes.items() if mode & 0o007} == {}, modes
    assert modes["data"] == modes["jobs"] == 0o750
    assert modes["appliance.db"] == modes["appliance.db-wal"] == 0o640

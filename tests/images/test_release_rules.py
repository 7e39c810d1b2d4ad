"""The installer's rules on what a signed bundle may say: no replayed old release as an upgrade, and no field of
release.json that is not a plain name (its version names an image tag and folders that are deleted and
replaced; its models name folders the installer writes). Both hold before anything on the box changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.bundle.box import InstallError, Release, version_key
from appliance.bundle.verify import verify_bundle

REPO_ROOT = Path(__file__).resolve().parents[2]


def record(state: Path, version: str) -> None:
    """The state an install of `version` leaves: its release record, and the pointer naming it in use."""
    folder = state / "releases" / version
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps({"version": version, "store_schema": 2, "models": []}))
    (state / "current").write_text(version + "\n")


def install(bundle: Path, state: Path, *options: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "appliance", "bundle", "install", str(bundle), "--state-dir", str(state), *options]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("in_use", ["0.2.0", "0.1.1", "1.0", "0.1.0.1"])
def test_an_older_signed_bundle_is_not_installed_over_a_newer_one(
    in_use: str, signed: Path, signing_key, tmp_path: Path
):
    """The signed bundle of conftest.py is 0.1.0: replayed over a newer release, it is refused before any change,
    with the way back an administrator means (rollback) and the option for doing it on purpose."""
    state = tmp_path / "state"
    record(state, in_use)
    verify_bundle(signed, signing_key.keyring, state)

    refused = install(signed, state, "--dry-run")

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"refused: 0.1.0 is older than {in_use}, the release in use" in refused.stderr
    assert "give --downgrade" in refused.stderr and refused.stdout == ""


def test_the_same_version_spelt_otherwise_is_refused_as_such(signed: Path, signing_key, tmp_path: Path):
    """0.1.0 over 0.1 is neither an upgrade nor older: two release folders for one version, said as such."""
    state = tmp_path / "state"
    record(state, "0.1")
    verify_bundle(signed, signing_key.keyring, state)

    refused = install(signed, state, "--dry-run")

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refused: 0.1.0 is another spelling of 0.1, the release in use" in refused.stderr


def test_downgrade_on_purpose_passes_the_version_rule(signed: Path, signing_key, tmp_path: Path):
    state = tmp_path / "state"
    record(state, "0.2.0")
    verify_bundle(signed, signing_key.keyring, state)

    done = install(signed, state, "--dry-run", "--downgrade")

    assert "older than" not in done.stderr
    assert "upgrade 0.2.0 -> 0.1.0" in done.stdout or "appliance bundle install:" in done.stderr, done.stderr


NUMBERS = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=4)
STAGES = st.one_of(
    st.just(""), st.builds(lambda kind, n: f"{kind}{n}", st.sampled_from(["a", "b", "rc"]), st.integers(0, 9))
)


def dotted(numbers: list[int], stage: str) -> str:
    return ".".join(map(str, numbers)) + stage


@settings(max_examples=200, deadline=None)
@given(a=NUMBERS, b=NUMBERS, stage_a=STAGES, stage_b=STAGES)
def test_versions_are_ordered_by_their_numbers_then_their_stage(a, b, stage_a, stage_b):
    def trimmed(numbers):
        numbers = list(numbers)
        while len(numbers) > 1 and numbers[-1] == 0:
            numbers.pop()
        return numbers

    rank = {"": (1, 0, 0)}
    for stage in (stage_a, stage_b):
        if stage:
            kind = stage.rstrip("0123456789")
            rank[stage] = (0, ["a", "b", "rc"].index(kind), int(stage[len(kind) :]))
    expected = (trimmed(a), rank[stage_a]) < (trimmed(b), rank[stage_b])

    assert (version_key(dotted(a, stage_a)) < version_key(dotted(b, stage_b))) == expected


def test_a_version_of_another_shape_is_not_ordered_and_needs_downgrade_on_purpose():
    assert version_key("nightly") is None and version_key("1.0-custom") is None
    assert version_key("1.0rc1") < version_key("1.0") < version_key("1.0.1")


# ----- release.json's fields --------------------------------------------------------------------------------------

BAD_NAMES = st.one_of(
    st.sampled_from(["", ".", "..", "../../etc", "/etc", "a/b", ".hidden", "-rf", "a b", "a\nb", "v1\x00", "é"]),
    st.text(min_size=129, max_size=140, alphabet="abc"),
    st.builds(lambda a, b: f"{a}/{b}", st.text("abc", min_size=1), st.text("abc.", min_size=1)),
    st.text(min_size=1, max_size=20).filter(lambda text: not text.isascii() or any(c in text for c in "/ \\:@")),
)
GOOD_NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(name=BAD_NAMES, field=st.sampled_from(["version", "model"]))
def test_a_release_field_that_is_not_a_plain_name_is_refused(tmp_path_factory, name, field):
    path = tmp_path_factory.mktemp("release") / "release.json"
    data = {"version": "0.1.0", "store_schema": 2, "models": ["SmolLM2-135M-Instruct"]}
    if field == "version":
        data["version"] = name
    else:
        data["models"].append(name)
    path.write_text(json.dumps(data))

    with pytest.raises(InstallError) as refused:
        Release.read(path)

    assert f"{path}: {field} {name!r} is not a plain name" in str(refused.value)


@settings(max_examples=50, deadline=None)
@given(version=GOOD_NAMES, model=GOOD_NAMES)
def test_plain_names_are_read_as_they_are(tmp_path_factory, version, model):
    path = tmp_path_factory.mktemp("release") / "release.json"
    path.write_text(json.dumps({"version": version, "store_schema": 2, "models": [model]}))

    assert Release.read(path) == Release(version, 2, (model,))


def test_images_bundle_refuses_an_image_whose_version_is_not_a_plain_name(signing_key, tmp_path: Path):
    from packaging_support import hashed_lock, image_archive, sbom_python

    lock = {"opt/appliance/share/requirements.lock": hashed_lock("pyyaml==6.0.2").encode()}
    labels = {"org.opencontainers.image.version": "../../var/lib/appliance"}
    archive = image_archive(tmp_path / "image.tar", [lock], "localhost/appliance:test", labels)
    client = tmp_path / "client"
    client.mkdir()
    (client / "requirements-3.9.txt").write_text(hashed_lock("pyyaml==6.0.2"))
    (client / "appliance-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    out = tmp_path / "bundle"

    made = subprocess.run(
        [str(REPO_ROOT / "images" / "bundle"), "--out", str(out), "--image-archive", str(archive)]
        + ["--client-wheels", str(client), "--sign-key", signing_key.uid],
        env={**os.environ, "GNUPGHOME": str(signing_key.home), "APPLIANCE_SBOM_PYTHON": sbom_python()},
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert made.returncode != 0 and not out.exists()
    assert "version '../../var/lib/appliance' is not a plain name" in made.stderr, made.stderr

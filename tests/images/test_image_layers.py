"""A layered rebuild after a code change: the dependency layer is reused, only the application's is new.

podman builds with --layers by default and caches a RUN by its text, whatever its bind mounts hold
(podman 4.3 here). The Dockerfile's COPY of the lock and of the application wheel's sha256 is what
makes the cache follow the inputs. This rebuilds the image CI built (images/ci-build-check) from a
copy of its build context whose one change is a line added to the project's code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from packaging_support import REPO_ROOT, link_or_copy, podman

pytestmark = pytest.mark.image


def changed_context(into: Path, marker: str) -> Path:
    """The build context (Dockerfile and images/, the wheelhouse hard-linked) with an application wheel
    built from this checkout's committed code plus one line."""
    context = into / "context"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy2(REPO_ROOT / name, context / name)
    shutil.copytree(
        REPO_ROOT / "images",
        context / "images",
        copy_function=link_or_copy,
        ignore=shutil.ignore_patterns("wheelhouse-app"),
    )
    source = into / "source"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    with (source / "appliance" / "__init__.py").open("a") as module:
        module.write(f"LAYER_CHECK = {marker!r}\n")
    app = context / "images" / "wheelhouse-app"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(app),
            str(source),
        ],
        check=True,
    )
    [wheel] = app.glob("appliance-*.whl")
    digest = subprocess.run(["sha256sum", wheel.name], cwd=app, check=True, capture_output=True, text=True).stdout
    (app / "appliance.sha256").write_text(digest)
    return context


def history(tag: str) -> list[dict]:
    """The image's history, oldest first: one entry per Dockerfile step, with the size it added."""
    return list(reversed(json.loads(podman("history", "--format", "json", tag).stdout)))


def step_size(tag: str, words: str) -> int:
    [size] = [entry["size"] for entry in history(tag) if words in entry.get("CreatedBy", "")]
    return size


def test_a_code_change_rebuilds_only_the_application_layer(image, base_image: dict, tmp_path: Path):
    built_layers = image.inspect["RootFS"]["Layers"]
    if len(built_layers) - len(base_image["RootFS"]["Layers"]) == 1:
        pytest.skip(f"{image.tag} was built with --layers=false: there is no layer cache to check")
    marker = uuid.uuid4().hex
    context = changed_context(tmp_path, marker)
    rebuilt = f"{image.tag}-code-change"
    base = base_image["RepoTags"][0]

    started = time.monotonic()
    build = podman(
        "build", "--format", "docker", "--isolation", "chroot", "--layers", "--build-arg", f"BASE_IMAGE={base}",
        "--tag", rebuilt, str(context),
    )  # fmt: skip
    seconds = time.monotonic() - started
    try:
        rebuilt_layers = json.loads(podman("image", "inspect", rebuilt).stdout)[0]["RootFS"]["Layers"]
        # Layers in common from the bottom (all of them when nothing was rebuilt).
        shared = next((i for i, (a, b) in enumerate(zip(built_layers, rebuilt_layers)) if a != b), len(rebuilt_layers))
        # Shared: the base, the install script, the lock, the dependencies. New: the sha256 and the application.
        assert (shared, len(rebuilt_layers)) == (len(built_layers) - 2, len(built_layers)), build.stdout
        steps = build.stdout.split("STEP ")
        [deps_step] = [step for step in steps if "install deps" in step]
        [app_step] = [step for step in steps if "install app" in step]
        assert "Using cache" in deps_step and "Using cache" not in app_step
        root = Path(podman("image", "mount", rebuilt).stdout.strip())
        [module] = root.glob("opt/appliance/lib/python3*/site-packages/appliance/__init__.py")
        assert f"LAYER_CHECK = {marker!r}" in module.read_text(), "the rebuilt image runs the old code"
        deps, app = step_size(image.tag, "install deps"), step_size(rebuilt, "install app")
        print(
            f"rebuilt in {seconds:.0f} s: dependency layer {deps / 1e9:.2f} GB reused, application layer {app / 1e6:.1f} MB new"
        )
    finally:
        podman("image", "unmount", rebuilt, check=False)
        podman("rmi", "--force", rebuilt, check=False)

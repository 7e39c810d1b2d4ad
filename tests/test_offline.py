"""No network, ever: the bundled model is provisioned, loaded and run with outbound sockets blocked."""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from appliance.offline import OFFLINE_ENVIRONMENT


def test_offline_variables_are_set_before_the_hub_library_reads_them():
    import huggingface_hub.constants

    assert {name: os.environ.get(name) for name in OFFLINE_ENVIRONMENT} == OFFLINE_ENVIRONMENT
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_the_guard_records_and_refuses_an_outbound_connection(no_network):
    with pytest.raises(RuntimeError, match="blocked by the test"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1: never routable

    assert no_network == ["192.0.2.1"]


@pytest.mark.model
def test_provision_load_and_generate_without_network(no_network, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from appliance.models.provision import DEMO_MODEL_NAME, provision_demo
    from appliance.models.store import ModelStore

    # Two provisioners at once (parallel test workers, two operators): one converts, the other waits for it.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(provision_demo, [tmp_path / "data"] * 2))
    assert sorted(created for _, created in results) == [False, True]
    model = results[0][0]
    assert ModelStore(tmp_path / "data").verify(DEMO_MODEL_NAME).path == model.path

    tokenizer = AutoTokenizer.from_pretrained(model.path, local_files_only=True)
    language_model = AutoModelForCausalLM.from_pretrained(model.path, local_files_only=True)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 6 * 7?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = language_model.generate(**inputs, max_new_tokens=6, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1] :]

    assert len(new_tokens) >= 1
    assert tokenizer.decode(new_tokens, skip_special_tokens=True).strip() != ""
    assert no_network == []
    assert {name: os.environ.get(name) for name in OFFLINE_ENVIRONMENT} == OFFLINE_ENVIRONMENT

"""Force every ML library we use into offline mode before it is imported.

The appliance runs on air-gapped boxes: nothing may try to reach a hub, a
telemetry endpoint or a usage-stats server. Entry points call
`enforce_offline()` first thing, before transformers, vllm or datasets load.
"""

import os

OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # Not a network setting: the tokenizers library's own thread pool, which warns and can deadlock after a
    # fork (the daemon forks workers, vLLM forks its engine).
    "TOKENIZERS_PARALLELISM": "false",
}


def enforce_offline() -> None:
    """Set the offline variables (overriding any value the caller set)."""
    os.environ.update(OFFLINE_ENVIRONMENT)


enforce_offline()  # at import: `import appliance.offline` first is all an entry point needs

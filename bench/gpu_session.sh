#!/usr/bin/env bash
# A GPU session's checks in one call to the offline GPU machine (docs/benchmarks.md has what they measured).
#
# Device time is short (15 minutes a session, the machine's start included) and each call pays a start, so everything
# runs in one command, in order of value, each stage under its own time limit and skipped when too little of the
# budget is left; each writes its log under $OUT (the device tool returns it), so a stage that fails or times out
# costs only itself:
#   step       bench/gpu_step.py: GRPO steps on a Qwen2.5-0.5B shape, FSDP2 packed, native rollout (and vLLM when its
#              kit is installed): phases, MFU against a measured bf16 peak, memory, generated tokens/s against HF
#              generate, the decode graphs' captures and their seconds; then the same with every lever the evidence
#              points at (no recomputation, one micro-batch per mini-batch, 512 samples at once, an engine that never
#              sleeps) against verl's defaults
#   gpu_tests  the GPU regression and decode-graph tests (tests/gpu); the memory ledger's at the very end
#   trl        bench/vs_trl.py on the GPU workload: rlcore against TRL's GRPOTrainer, alternating, same settings
#   vllm_tests tests/rollout/test_vllm.py on CUDA (the adapter's parity tests; only with the vLLM kit)
#   moe        bench/moe_rollout.py: a Qwen3-30B-A3B layer shape (8 layers) in bf16 through the native engine, greedy
#              parity with HF generate and the training forward, tokens/s against HF generate, with R3 recording
#
# The call carries .gpu (`bash ../shared/gpu/build_bundle.sh`: rlcore's packages for CPython 3.12) and .whl (TRL
# 1.16.0, datasets 5.2.0, dill, multiprocess wheels: docs/benchmarks.md has the download command), then runs
#   bash bench/gpu_session.sh [BUDGET_SECONDS]     # default 560, for a call of timeout_s=600
# vLLM is optional: when earlier calls filled /tmp/vllm-kit.tar with `bash ../shared/gpu/vllm_kit.sh`'s parts, the step
# also runs vLLM and the vllm_tests stage runs. STAGES="step trl" picks stages (default: all, in the order above).
# GPU_SESSION_DRY=1 runs every stage on this CPU with tiny shapes and the current python (tests/test_gpu_session.py).
set -u
STAGES=${STAGES:-step gpu_tests trl vllm_tests moe}
BUDGET=${1:-560}
END=$((SECONDS + BUDGET))
LOGS=${OUT:-/tmp/gpu_session}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
DRY=${GPU_SESSION_DRY:-0}
STEP_OUT=/tmp/gpu_step; [ "$DRY" = 1 ] && STEP_OUT=$LOGS/gpu_step_runs

stage() {  # stage NAME NEEDS_SECONDS CAP_SECONDS COMMAND...: runs COMMAND if NEEDS_SECONDS are left, for at most CAP
  local name=$1 need=$2 cap=$3 left=$((END - SECONDS)) start=$SECONDS rc
  shift 3
  case " $STAGES " in *" $name "*) ;; *) echo "== $name: not in STAGES" | tee -a "$SUMMARY"; return ;; esac
  if [ "$left" -lt "$need" ]; then
    echo "== $name: skipped, $left s of the budget left (needs $need)" | tee -a "$SUMMARY"
    return
  fi
  [ "$cap" -lt "$left" ] || cap=$left
  echo "== $name: $* (at most $cap s)" | tee -a "$SUMMARY"
  timeout -k 15 "$cap" "$@" >> "$LOGS/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$SUMMARY"
  tail -n 40 "$LOGS/$name.log"
}

VLLM_READY=0
if [ "$DRY" = 1 ]; then
  # This machine's python with rlcore's dependencies; TRL from its venv when there is one (setup_trl_venv.sh).
  PY=${PYTHON:-python3}; RLCORE=""; VLLM=""; TRL_ENV=()
  TRL_PY=.cache/trl_venv/bin/python; [ -x "$TRL_PY" ] && TRL_ARGS=(--trl-python "$TRL_PY") || TRL_ARGS=(--no-trl)
  TRL=("$PY" bench/vs_trl.py --spec bench/vs_trl/grpo_arith_cpu_v1.json --betas 0.001 --steps 2 --runs 1 "${TRL_ARGS[@]}")
  SHAPE=(--device cpu --dtype float32 --models tiny-qwen3 --steps 2 --prompts 4 --n 2 --response-length 8)
  MOE=("$PY" bench/moe_rollout.py --prompts 2 --n 2 --max_tokens 4 --reps 1)
  GPU_TESTS=("$PY" -m pytest -q -p no:cacheprovider -m gpu)   # all skip without CUDA: the command holds
  echo "dry run on $(nproc) CPU cores" >> "$SUMMARY"
else
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    git log -1 --format='commit %h %s' 2>/dev/null || true
  } >> "$SUMMARY" 2>&1
  # The packages: rlcore's (ray, hydra, tensordict, ...) into /tmp/site, TRL's into /tmp/trlsite, vLLM's kit into
  # /tmp/vsite when its parts came (install.sh checks the tar's sha256 first).
  t=$SECONDS
  bash .gpu/run_on_gpu.sh true >> "$SUMMARY" 2>&1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/trlsite .whl/*.whl >> "$SUMMARY" 2>&1
  if [ -f /tmp/vllm-kit.tar ] && [ -f .gpu/vllm/install.sh ]; then
    bash .gpu/vllm/install.sh true >> "$SUMMARY" 2>&1 && VLLM_READY=1
  fi
  echo "packages installed in $((SECONDS - t)) s; vLLM kit installed: $VLLM_READY" >> "$SUMMARY"
  PY=python3; RLCORE="bash .gpu/run_on_gpu.sh"; VLLM=""; [ $VLLM_READY = 1 ] && VLLM="bash .gpu/vllm/install.sh"
  # TRL without vLLM on its path: TRL's GRPOTrainer generates with transformers unless told to use a vLLM server.
  TRL=(env PYTHONPATH=/tmp/trlsite $RLCORE python3 bench/vs_trl.py --spec bench/vs_trl/grpo_arith_gpu_v1.json
       --betas 0.001 --steps 4 --runs 1 --trl-python python3)
  SHAPE=(--models qwen2.5-0.5b --steps 3)
  MOE=($RLCORE python3 bench/moe_rollout.py --reps 3)
  GPU_TESTS=($RLCORE python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m "gpu and not slow")
fi
cat "$SUMMARY"
ROLLOUTS=native; [ $VLLM_READY = 1 ] && ROLLOUTS=vllm,native
STEP=($VLLM $RLCORE $PY bench/gpu_step.py "${SHAPE[@]}" --engines fsdp2 --modes packed --out "$STEP_OUT")
# Every lever the evidence points at, at once (docs/benchmarks.md): a 0.5B model's activations fit the GPU without
# recomputation; one micro-batch per mini-batch (128 samples x <= 272 tokens) launches 3x fewer, larger kernels;
# all 512 samples decode together (one prefill, no second wave); and the engine never sleeps (free_cache_engine=False:
# its weights, 1.7 GiB of KV and its decode graphs stay, so the graphs are captured once, not after every wake-up).
LEVERS=(--override actor_rollout_ref.model.enable_gradient_checkpointing=False
        --override actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40960
        --override actor_rollout_ref.rollout.max_num_seqs=512
        --override actor_rollout_ref.rollout.free_cache_engine=False --tag levers --skip-hf)

# The step first: it measures what changed since the last loan (the decode graphs' captures, the levers); the ratio
# against TRL (1.31x on the H200 at 2f86cfb) after it, then the GPU tests of the changed decode.
stage step 90 170 "${STEP[@]}" --rollouts $ROLLOUTS --json "$LOGS/step.json"
stage step 70 120 "${STEP[@]}" --rollouts native "${LEVERS[@]}" --json "$LOGS/step_levers.json"
stage gpu_tests 45 120 "${GPU_TESTS[@]}" tests/gpu/test_gpu_regressions.py tests/gpu/test_rollout_graphs.py
stage trl 120 240 "${TRL[@]}"
if [ $VLLM_READY = 1 ]; then
  # -x -rf: the first failure and its traceback are printed at once (a run stopped at its limit printed only "F")
  stage vllm_tests 60 150 $VLLM $RLCORE python3 -m pytest -x -rf --tb=short -p no:cacheprovider -m vllm tests/rollout/test_vllm.py
else
  echo "== vllm_tests: skipped, no vLLM kit on this machine" | tee -a "$SUMMARY"
fi
stage moe 60 120 "${MOE[@]}"
# The memory ledger's runs train the 0.5B shape (the H200 at 2f86cfb spent over 120 s in its first case): last.
stage gpu_tests 90 300 "${GPU_TESTS[@]}" tests/gpu/test_gpu_memory.py
echo "== done: $((SECONDS)) s" | tee -a "$SUMMARY"

#!/usr/bin/env bash
# A GPU session's checks in one call to the offline GPU machine (docs/benchmarks.md has what they measured).
#
# Device time is short (minutes) and each call pays a start, so everything runs in one command, in order of value,
# each stage under its own time limit and skipped when too little of the budget is left; each writes its log under
# $OUT (the device tool returns it), so a stage that fails or times out costs only itself:
#   smoke      the vLLM kit's stand-alone check (greedy tokens vs HF, reload, sleep levels 1 and 2)
#   step       bench/gpu_step.py: GRPO steps on a Qwen2.5-0.5B shape through the hybrid engine, vLLM and native
#              rollout, FSDP2 packed: phases, MFU against a measured bf16 peak, sync seconds and bytes, memory after
#              sleep, generated tokens/s against HF generate
#   trl        bench/vs_trl.py on the GPU workload: rlcore against TRL's GRPOTrainer, alternating, same settings
#   vllm_tests tests/rollout/test_vllm.py on CUDA (the adapter's parity tests)
#   moe        bench/moe_rollout.py: a Qwen3-30B-A3B layer shape (8 layers) in bf16 through the native engine, greedy
#              parity with HF generate and the training forward, tokens/s against HF generate, with R3 recording
#   extra      the padded native run (packed vs padded) and the GPU regression tests, as time allows
#
# Before it, the calls that deliver `bash ../shared/gpu/vllm_kit.sh`'s parts (VLLM_KIT_SLIM=1) must have filled
# /tmp/vllm-kit.tar; the last call carries the last part, .gpu/vllm/{install.sh,vllm_smoke.py}, .gpu/site.tar.xz,
# .gpu/run_on_gpu.sh (`bash ../shared/gpu/build_bundle.sh`) and .whl (TRL 1.16.0, datasets 5.2.0, dill, multiprocess
# wheels for CPython 3.12), appends the part as the kit prints, then runs:
#   bash bench/gpu_session.sh [BUDGET_SECONDS]     # default 480
# STAGES="step trl" picks stages (default: all, in the order above). The first session (2026-11-27, H100) passed the
# smoke check and ran the vLLM step; the next one should start with STAGES="step trl vllm_tests moe extra".
set -u
STAGES=${STAGES:-smoke step trl vllm_tests moe extra}
BUDGET=${1:-480}
END=$((SECONDS + BUDGET))
LOGS=${OUT:-/tmp/gpu_session}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

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
  tail -n 30 "$LOGS/$name.log"
}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -m pip show pyarrow fsspec huggingface-hub accelerate 2>/dev/null | grep -E '^(Name|Version)' | paste - - | tr '\n' ' '
  echo
} >> "$SUMMARY" 2>&1

# The packages: vLLM's kit into /tmp/vsite (install.sh checks the tar's sha256 first), rlcore's (ray, hydra,
# tensordict, ...) into /tmp/site, TRL's into /tmp/trlsite.
t=$SECONDS
bash .gpu/vllm/install.sh true >> "$SUMMARY" 2>&1 || echo "vLLM kit: not installed (see above)" >> "$SUMMARY"
bash .gpu/run_on_gpu.sh true >> "$SUMMARY" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/trlsite .whl/*.whl >> "$SUMMARY" 2>&1
echo "packages installed in $((SECONDS - t)) s" >> "$SUMMARY"
cat "$SUMMARY"

VLLM="bash .gpu/vllm/install.sh"    # vLLM importable (and VLLM_ENABLE_V1_MULTIPROCESSING=0)
RLCORE="bash .gpu/run_on_gpu.sh"    # rlcore's packages importable
STEP=(python3 bench/gpu_step.py --models qwen2.5-0.5b --engines fsdp2 --steps 3 --out /tmp/gpu_step)

stage smoke 60 150 $VLLM python3 .gpu/vllm/vllm_smoke.py
stage step 120 280 $VLLM $RLCORE "${STEP[@]}" --modes packed --rollouts vllm,native --json "$LOGS/step.json"
# TRL without vLLM on its path: TRL's GRPOTrainer generates with transformers unless told to use a vLLM server.
stage trl 90 180 env PYTHONPATH=/tmp/trlsite $RLCORE python3 bench/vs_trl.py --spec bench/vs_trl/grpo_arith_gpu_v1.json \
  --betas 0.001 --steps 4 --runs 1 --trl-python python3
# -x -rf: the first failure and its traceback are printed at once (a run stopped at its limit printed only "F")
stage vllm_tests 60 150 $VLLM $RLCORE python3 -m pytest -x -rf --tb=short -p no:cacheprovider -m vllm tests/rollout/test_vllm.py
stage moe 60 150 $RLCORE python3 bench/moe_rollout.py --reps 3
stage extra 60 200 $RLCORE "${STEP[@]}" --modes padded --rollouts native
stage extra 45 150 $RLCORE python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
echo "== done: $((SECONDS)) s" | tee -a "$SUMMARY"

#!/usr/bin/env bash
# The device check of the real model path (docs/GPU.md): Qwen3.5-2B in vLLM 0.33 with weight pushes
# from a transformers training copy, at most 10 minutes on one H200. One printed line per check:
#
#   versions            vllm / torch / transformers / trl / peft and the GPU
#   load                the model loads in vLLM (its architecture, the time)
#   push in-process     after a push of changed weights the engine's log-probs match transformers' on
#                       those weights (parity, not only a change); pushing the originals restores greedy
#                       output exactly
#   push LoRA           the same with merged LoRA adapters; the base weights restore it
#   long prompt         a batch holding a prompt longer than max_model_len runs (the prompt is cut)
#   rsft step           one RSFT step of the model (bf16 autocast): times, peak memory, push time
#   save + resume       the saved state restores into a fresh training copy and pushes the same output
#   push multiprocess   the push round trip (with parity) with the engine core in its own process
#   push continuous     the same on the async engine (continuous batching)
#   parity float32      vLLM vs transformers log-probs of 8 continuations, both in float32
#   parity bfloat16     the same in bfloat16
#   batch-invariant     with VLLM_BATCH_INVARIANT a seeded sample is the same alone and in a batch
#   whale cycle         a short `whale train` of configs/gpu/math_whale.yaml: RSFT steps, a harness phase;
#                       every push's own check (the ledger's push_check: engine vs transformers log-probs
#                       on a fixed probe, bf16 tolerance 0.5 per token) recorded and passed
#   multi-gpu           where more than one GPU is visible, benchmarks/gpu_check_multi.sh (tensor parallel,
#                       vllm serve replicas, accelerate DDP and FSDP2, compare --gpus-per-run); on one GPU
#                       it says it was skipped
#
#   bash benchmarks/gpu_check.sh [MODEL]     (default Qwen/Qwen3.5-2B, from the Hugging Face cache)
#
# Exit status: 0 all passed, 1 a check failed, 3 no GPU / no vllm / no model here (nothing was run).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MODEL=${1:-Qwen/Qwen3.5-2B}
OUT=${OUT:-gpu_check_out}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA GPU here; this check needs one (nothing was run)." >&2
  exit 3
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: vllm is not installed: pip install -e '.[gpu,kernels]' (nothing was run)." >&2
  exit 3
fi
if ! "$PY" -c "import sys; from whale_train.llm.vllm_backend import model_files; model_files(sys.argv[1])" "$MODEL" 2>/dev/null; then
  echo "gpu_check: $MODEL is neither a directory nor in the Hugging Face cache (downloads are off; nothing was run)." >&2
  exit 3
fi
mkdir -p "$OUT"
status=0
START=$SECONDS

# run NAME SECONDS CMD...: its lines go to stdout, everything else to $OUT/NAME.log; a timeout is a FAIL.
run() {
  local name=$1 limit=$2
  shift 2
  timeout --signal=KILL "$limit" "$@" 2> "$OUT/$name.log"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    [ "$rc" -eq 137 ] && echo "$name: FAIL timed out after $limit s (log: $OUT/$name.log)"
    [ "$rc" -ne 1 ] && [ "$rc" -ne 137 ] && echo "$name: FAIL exit $rc: $(tail -n 1 "$OUT/$name.log")"
  fi
}

check() { run "$1" "$2" "$PY" benchmarks/gpu_check.py "$1" --model "$MODEL" --out "$OUT"; }

check versions 30
check push 180
check push-multiprocess 80
check push-continuous 80
check parity-float32 60
check parity-bfloat16 55
check batch-invariant 55

# One short WHALE cycle on the GPU config: 2 RSFT steps of 16 tasks x 4 samples, then the harness phase
# (re-scoring and one search iteration), vLLM rollouts and bf16 training of a transformers copy.
rm -rf "$OUT/whale"
run whale-train 140 "$PY" -m whale_train.cli train configs/gpu/math_whale.yaml --out "$OUT/whale" --no-report \
  --set "model=$MODEL" --set budget_rollouts=400 --set rsft.batch_tasks=16 --set rsft.samples=4 \
  --set schedule.weight_epochs=0.01 --set schedule.harness_iterations=2 --set search.harness_tasks=16 \
  --set search.candidates=1 --set search.frontier_size=1 --set eval.limit=32 --set eval.k=2 \
  --set backend_options.max_model_len=4096 --set backend_options.enforce_eager=true > "$OUT/whale.stdout"
"$PY" - "$OUT/whale" <<'PY' || status=1
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
try:
    events = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
except FileNotFoundError:
    print("whale cycle: FAIL no ledger"); sys.exit(1)
units = [e for e in events if e["event"] == "unit"]
weight = [u["signals"] for u in units if u["phase"] == "weight"]
harness = [u for u in units if u["phase"] == "harness"]
evals = [e for e in events if e["event"] == "eval"]
version = max((u["model_version"] for u in units), default=0)
# every push was checked by the backend (engine vs transformers log-probs on a fixed probe, bf16 engine)
failed = [line for line in (run.parent / "whale.stdout").read_text().splitlines() if "check failed" in line]
if failed:  # a push the engine did not take stopped the run: its one line
    print(f"whale cycle: FAIL {failed[0].strip()}"); sys.exit(1)
checks = [w["push_check"] for w in weight if w.get("push_seconds") is not None]
pushed = sum(1 for w in weight if w.get("push_seconds") is not None)
ok = bool(weight) and bool(harness) and version >= 1 and len(evals) >= 2
ok = ok and len(checks) == pushed and all(c["ok"] for c in checks)
diffs = [c["max_abs_diff"] for c in checks]
print(f"whale cycle: {'PASS' if ok else 'FAIL'} {len(weight)} RSFT steps "
      f"({sum(w['sample_seconds'] for w in weight):.0f} s sampling, {sum(w['train_seconds'] for w in weight):.0f} s "
      f"training + pushes), {len(harness)} harness units, model v{version}, "
      f"test mean@{evals[-1]['k'] if evals else '?'} {[round(100 * e['mean'], 1) for e in evals]}; "
      f"push checks {len(checks)}/{pushed}, max |logp engine - logp trained| per push {diffs} "
      f"(tolerance {checks[0]['tolerance'] if checks else '?'})")
sys.exit(0 if ok else 1)
PY
# Beyond one GPU (docs/SCALING.md): the multi-GPU step, where more than one GPU is visible.
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -gt 1 ]; then
  echo "multi-gpu: $GPUS GPUs visible, running benchmarks/gpu_check_multi.sh"
  if OUT="$OUT" PYTHON="$PY" timeout --signal=KILL 1800 bash benchmarks/gpu_check_multi.sh 2> "$OUT/multi.log"; then
    echo "multi-gpu: PASS"
  else
    status=1
    echo "multi-gpu: FAIL $(tail -n 1 "$OUT/multi.log") (log: $OUT/multi.log)"
  fi
else
  echo "multi-gpu: skipped ($GPUS GPU visible; the multi-GPU step needs 2 or more)"
fi
echo "gpu_check: $([ $status -eq 0 ] && echo all passed || echo FAILED) in $((SECONDS - START)) s (logs in $OUT/)"
exit "$status"

#!/usr/bin/env bash
# GPU check (one command, under 10 minutes on one GPU): the vLLM backend serves the tiny model and its
# mean@8 matches the transformers backend's within noise; then one short WHALE cycle trains with vLLM
# rollouts and bf16 training (the weights pushed into the engine after every RSFT step). Run it wherever
# a GPU is available and record the printed result in the README. On a CPU-only machine it exits with a
# clear message.
#
#   bash benchmarks/gpu_check.sh [MODEL_DIR]      (default: the shipped tiny model)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA GPU here; this check needs one (nothing was run)." >&2
  exit 3
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: vllm is not installed: pip install -e '.[gpu]' (nothing was run)." >&2
  exit 3
fi
MODEL=${1:-$("$PY" -c "from whale_train.llm import default_model; print(default_model())")}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
for env in "whale/Math-v0 math/h0" "whale/Chess-v0 chess_puzzles/h0"; do
  set -- $env
  for backend in transformers vllm; do
    "$PY" -m whale_train.cli eval --env "$1" --harness "$2" --model "$MODEL" --backend "$backend" \
      --limit 200 --k 8 --trusted --out "$OUT/${2//\//_}_$backend" > "$OUT/${2//\//_}_$backend.log"
  done
done
# One WHALE cycle of configs/math/whale.yaml (5 RSFT steps, the rescore and 2 search iterations, one more
# RSFT step under the new harness), with vLLM rollouts and bf16 training of a transformers copy.
rm -rf "$OUT/whale_gpu"
if ! "$PY" -m whale_train.cli train configs/math/whale.yaml --set backend=vllm --set rsft.bf16=true \
    --set "model=$MODEL" --set budget_rollouts=1900 --set eval.limit=50 \
    --out "$OUT/whale_gpu" --no-report > "$OUT/whale_gpu.log" 2>&1; then
  tail -n 30 "$OUT/whale_gpu.log" >&2
  echo "gpu_check: the WHALE cycle failed (log: $OUT/whale_gpu.log)" >&2
  exit 1
fi
status=0
"$PY" - "$OUT" <<'PY' || status=1
import json, math, sys
from pathlib import Path
out = Path(sys.argv[1]); ok = True
for name in ("math_h0", "chess_puzzles_h0"):
    t = json.loads((out / f"{name}_transformers" / "results.json").read_text())
    v = json.loads((out / f"{name}_vllm" / "results.json").read_text())
    diff, se = v["mean"] - t["mean"], math.hypot(t["se"], v["se"])
    same = abs(diff) <= 2 * se + 1e-9
    ok &= same
    print(f"{name}: transformers {100*t['mean']:.1f}% ± {100*t['se']:.1f}, vllm {100*v['mean']:.1f}% ± {100*v['se']:.1f}, "
          f"diff {100*diff:+.1f} ({'within' if same else 'OUTSIDE'} 2 SE); vllm {v['episodes_per_second']} episodes/s")
sys.exit(0 if ok else 1)
PY
"$PY" - "$OUT/whale_gpu" <<'PY' || status=1
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
events = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
units = [e for e in events if e["event"] == "unit"]
weight = [u["signals"] for u in units if u["phase"] == "weight"]
harness = [u for u in units if u["phase"] == "harness"]
evals = [e for e in events if e["event"] == "eval"]
budget = events[0]["budget"]
spent = sum(u["rollouts"] for u in units)
version = max(u["model_version"] for u in units)
avg = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
print(f"whale cycle (vllm rollouts, bf16 training): {len(weight)} RSFT steps "
      f"({avg([w['sample_seconds'] for w in weight]):.1f} s sampling + {avg([w['train_seconds'] for w in weight]):.1f} s "
      f"training, weight push and checkpoint each), {len(harness)} harness units "
      f"({avg([u['seconds'] for u in harness]):.1f} s each), model v{version}, {spent} of {budget} rollouts; "
      f"test mean@{evals[-1]['k']} {100*evals[0]['mean']:.1f}% -> "
      f"{100*evals[-1]['mean']:.1f}%; {json.loads((run / 'state.json').read_text())['elapsed']:.0f} s")
ok = spent == units[-1]["rollouts_total"] <= budget and version >= 1 and bool(harness)
sys.exit(0 if ok else 1)
PY
exit "$status"

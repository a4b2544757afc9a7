#!/usr/bin/env bash
# Multi-GPU check (docs/SCALING.md), a step of benchmarks/gpu_check.sh: the paths beyond one GPU.
#   1. the in-process vLLM engine with tensor_parallel_size=2 runs a short WHALE cycle;
#   2. two `vllm serve` replicas take the rollouts of a short cycle, the trained weights are broadcast to
#      both after every RSFT step (NCCL, vLLM's weight-transfer routes): every replica ends at the last
#      version with the same weight checksums, computes with the trained weights (its greedy tokens
#      equal transformers' on the last pushed checkpoint, float32 on both sides, and its log-probs of
#      them match to 2e-3), and the ledger has the push time of every update;
#   3. `accelerate launch` on 2 GPUs (DDP) trains a short cycle whose ledger matches one process's
#      (but for the loss and wall-clock fields);
#   4. the same cycle under FSDP2 (configs/accelerate/fsdp2.yaml: every parameter and the AdamW state
#      sharded over the 2 GPUs, gathered for each push, checkpoint and evaluation copy): its ledger is
#      one process's and its checkpoints hold whole tensors (resuming from one: a CPU test);
#   5. `whale compare --gpus-per-run 1` runs the smoke grid's first seed with disjoint GPUs per job.
# On a machine with fewer than 2 GPUs it prints that the steps were skipped and exits 0.
#
#   bash benchmarks/gpu_check_multi.sh [MODEL_DIR]      (default: the shipped tiny model)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
BIN=$(dirname "$PY")
export HF_HUB_OFFLINE=1
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 2 ]; then
  echo "gpu_check_multi: $GPUS GPU(s) here; the multi-GPU steps (tensor parallel, vllm serve replicas with NCCL weight sync, accelerate DDP and FSDP2, compare --gpus-per-run) were skipped: they need 2 or more."
  exit 0
fi
"$PY" -c "import vllm, ray, accelerate" 2>/dev/null || {
  echo "gpu_check_multi: needs pip install -e '.[gpu,scale]' (nothing was run)." >&2
  exit 3
}
MODEL=${1:-$("$PY" -c "from whale_train.llm import default_model; print(default_model())")}
OUT=${OUT:-gpu_check_out}/multi
rm -rf "$OUT" && mkdir -p "$OUT"
SHORT=(--set "model=$MODEL" --set budget_rollouts=400 --set eval.limit=20 --set eval.k=2
       --set rsft.batch_tasks=16 --set rsft.samples=4 --set search.harness_tasks=16 --no-report)
fail() { echo "gpu_check_multi: $1 (logs in $OUT)" >&2; exit 1; }

echo "1/5 tensor parallel: vllm in-process, tensor_parallel_size=2"
CUDA_VISIBLE_DEVICES=0,1 "$PY" -m whale_train.cli train configs/math/whale.yaml --set backend=vllm \
  --set tensor_parallel_size=2 --set rsft.bf16=true "${SHORT[@]}" --out "$OUT/tp2" > "$OUT/tp2.log" 2>&1 \
  || { tail -n 30 "$OUT/tp2.log" >&2; fail "the TP=2 cycle failed"; }

echo "2/5 replicas: two vllm serve on GPU 1 and GPU $((GPUS > 2 ? 2 : 1)), weights broadcast from GPU 0"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
for i in 0 1; do
  gpu=$((GPUS > 2 ? i + 1 : 1))
  VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=$gpu "$BIN/vllm" serve "$MODEL" --port $((8100 + i)) \
    --gpu-memory-utilization 0.35 --dtype float32 --weight-transfer-config '{"backend": "nccl"}' \
    > "$OUT/serve$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$((8100 + i))/health" > /dev/null && break; sleep 1; done
  curl -sf "http://127.0.0.1:$((8100 + i))/health" > /dev/null || fail "vllm serve $i did not start"
done
CUDA_VISIBLE_DEVICES=0 "$PY" -m whale_train.cli train configs/math/whale.yaml --set backend=openai \
  --set "base_url=http://127.0.0.1:8100/v1,http://127.0.0.1:8101/v1" \
  --set 'backend_options={weight_sync: {master_address: 127.0.0.1, master_port: 29650}, return_token_ids: true}' \
  --set rsft.bf16=true "${SHORT[@]}" --out "$OUT/replicas" > "$OUT/replicas.log" 2>&1 \
  || { tail -n 30 "$OUT/replicas.log" >&2; fail "the replica cycle failed"; }
"$PY" - "$OUT/replicas" "$MODEL" <<'PY' || fail "replica check failed"
import json, sys, urllib.request
from pathlib import Path
run = Path(sys.argv[1])
units = [json.loads(l) for l in (run / "ledger.jsonl").read_text().splitlines() if '"event": "unit"' in l]
updates = [u for u in units if u["phase"] == "weight" and u["signals"].get("updated")]
pushes = [u["signals"].get("push_seconds") for u in updates]
assert updates and all(p is not None for p in pushes), f"push_seconds missing: {pushes}"
def call(port, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())
versions = [call(p, "/weight_info")["weight_version"] for p in (8100, 8101)]
sums = [call(p, "/weight_checker", {"action": "checksum"})["checksums"] for p in (8100, 8101)]
assert versions == [str(len(updates))] * 2, (versions, len(updates))
assert sums[0] == sums[1], "the replicas hold different weights"
print(f"  {len(updates)} pushes to 2 replicas, {min(pushes):.2f}-{max(pushes):.2f} s each; versions {versions}; checksums equal")
# the engines compute with the pushed weights: the last checkpoint (saved under the pushed version)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.hf import TransformersLLM
from whale_train.llm.openai_compat import OpenAILLM
model_dir = sys.argv[2]
ckpt = run / "checkpoints" / versions[0]
assert ckpt.is_dir(), f"no checkpoint of the pushed version {versions[0]}: {sorted(p.name for p in (run / 'checkpoints').iterdir())}"
def load(path):
    if (path / "adapter_config.json").exists():  # LoRA: the push is the merged model
        from peft import PeftModel
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return PeftModel.from_pretrained(base, str(path)).merge_and_unload().to("cuda:0")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to("cuda:0")
tok = AutoTokenizer.from_pretrained(model_dir)
trained = TransformersLLM(load(ckpt), tok)
base = TransformersLLM(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda:0"), tok)
prompts = ["What is 2+3? Answer:", "Solve for x: 2x + 4 = 10. x =", "The capital of France is", "12 * 7 ="]
greedy = lambda llm: [c.completion_ids for c in llm.complete(
    [Request(p, SamplingParams(temperature=0, max_tokens=12), seed=i) for i, p in enumerate(prompts)])]
want = greedy(trained)
conts = [tok.decode(ids) for ids in want]
ref = [trained.score(p, [c])[0].logprob for p, c in zip(prompts, conts)]
moved = max(abs(a - base.score(p, [c])[0].logprob) for a, p, c in zip(ref, prompts, conts))
for port in (8100, 8101):
    server = OpenAILLM(f"http://127.0.0.1:{port}/v1", model_dir, tokenizer=model_dir, return_token_ids=True)
    assert greedy(server) == want, f"replica :{port} does not sample what the trained weights do: {greedy(server)} != {want}"
    got = [server.score(p, [c])[0].logprob for p, c in zip(prompts, conts)]
    worst = max(abs(a - b) for a, b in zip(got, ref))
    assert worst < 2e-3, f"replica :{port} log-probs differ from the trained weights' by {worst:.2e}"
    print(f"  replica :{port}: greedy tokens = transformers' on checkpoint {versions[0]}; log-probs within {worst:.1e}")
print(f"  (the trained weights move those log-probs by {moved:.2e} from the base model's"
      + (": too little to tell a missed push apart, train longer)" if moved < 2e-2 else ")"))
PY
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
PIDS=()

echo "3/5 accelerate launch, 2 GPUs (DDP): rank 0 drives, both train"
CUDA_VISIBLE_DEVICES=0 "$PY" -m whale_train.cli train configs/math/whale.yaml "${SHORT[@]}" --out "$OUT/one" \
  > "$OUT/one.log" 2>&1 || fail "the one-process cycle failed"
CUDA_VISIBLE_DEVICES=0,1 "$BIN/accelerate" launch --multi_gpu --num_processes 2 --num_machines 1 \
  --mixed_precision no --dynamo_backend no -m whale_train.cli train configs/math/whale.yaml "${SHORT[@]}" \
  --out "$OUT/ddp2" > "$OUT/ddp2.log" 2>&1 || { tail -n 30 "$OUT/ddp2.log" >&2; fail "the DDP cycle failed"; }
"$PY" - "$OUT" <<'PY' || fail "DDP check failed"
import json, sys
from pathlib import Path
def ledger(run):
    strip = lambda x: {k: strip(v) for k, v in x.items() if not k.endswith("seconds") and k != "loss"} if isinstance(x, dict) else x
    return [strip(json.loads(l)) for l in (Path(sys.argv[1]) / run / "ledger.jsonl").read_text().splitlines()]
a, b = ledger("one"), ledger("ddp2")
same = sum(x == y for x, y in zip(a, b))
print(f"  ledger events equal to one process's: {same} of {len(a)} (bf16 / GPU kernels may move a sample)")
assert b[-1]["event"] == "stop"
PY

echo "4/5 accelerate launch, 2 GPUs, FSDP2 (configs/accelerate/fsdp2.yaml): rank 0 drives, both hold shards"
CUDA_VISIBLE_DEVICES=0,1 "$BIN/accelerate" launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 \
  --mixed_precision no -m whale_train.cli train configs/math/whale.yaml "${SHORT[@]}" \
  --out "$OUT/fsdp2" > "$OUT/fsdp2.log" 2>&1 || { tail -n 30 "$OUT/fsdp2.log" >&2; fail "the FSDP2 cycle failed"; }
"$PY" - "$OUT" <<'PY' || fail "FSDP2 check failed"
import json, sys
from pathlib import Path
from safetensors.torch import load_file
out = Path(sys.argv[1])
def ledger(run):
    strip = lambda x: {k: strip(v) for k, v in x.items() if not k.endswith("seconds") and k != "loss"} if isinstance(x, dict) else x
    return [strip(json.loads(l)) for l in (out / run / "ledger.jsonl").read_text().splitlines()]
a, b = ledger("one"), ledger("fsdp2")
same = sum(x == y for x, y in zip(a, b))
print(f"  ledger events equal to one process's: {same} of {len(a)} (GPU kernels may move a sample)")
versions = sorted(int(p.name) for p in (out / "fsdp2" / "checkpoints").iterdir() if p.name.isdigit())
one = load_file(str(next((out / "one" / "checkpoints").glob("1/model.safetensors"))))
two = load_file(str(out / "fsdp2" / "checkpoints" / "1" / "model.safetensors"))
assert one.keys() == two.keys() and all(one[k].shape == two[k].shape for k in one), "the FSDP2 checkpoint is not whole"
assert b[-1]["event"] == "stop" and versions, "the FSDP2 cycle saved no model version"
print(f"  {len(versions)} model versions saved whole from the shards")
PY

echo "5/5 whale compare --gpus-per-run 1 --jobs $GPUS"
"$PY" -m whale_train.cli compare configs/compare/smoke.yaml --gpus-per-run 1 --jobs "$GPUS" \
  --out "$OUT/compare" > "$OUT/compare.log" 2>&1 || { tail -n 20 "$OUT/compare.log" >&2; fail "compare failed"; }
"$PY" - "$OUT/compare" <<'PY' || fail "placement check failed"
import json, sys
from pathlib import Path
spans = []
for p in Path(sys.argv[1]).glob("runs/*/placement.jsonl"):
    for line in p.read_text().splitlines():
        spans.append((json.loads(line)["devices"], p.parent.name))
print(f"  {len(spans)} runs on devices {sorted({d for d, _ in spans})}")
assert spans and all(d and len(d.split(",")) == 1 for d, _ in spans)
PY
echo "gpu_check_multi: all 5 steps passed on $GPUS GPUs"

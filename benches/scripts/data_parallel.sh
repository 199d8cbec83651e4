#!/usr/bin/env bash
# Data-parallel scaling: GPT-2 124M training in bf16, batch 8 x 1024 per GPU, on tinyshakespeare,
# with `tessera train --devices` and PyTorch DDP (torchrun, eager autocast) in the same run.
# One JSON line per measurement; tokens/s are the whole world's, per_gpu divides by N.
#
#   benches/scripts/data_parallel.sh 1 2 4      (tessera on PATH; TESSERA_SHARED or ../shared)
#
# TESSERA_ARGS adds options to tessera's runs (e.g. "--bucket-mb 100000": one bucket, reduced
# after the backward pass instead of beside it); STEPS sets their length (60).
#
# tessera's figure is the median of its metrics windows after the first (which holds the
# kernels' compilation and the first, recorded steps). N = 1 is also run without --devices
# (no collectives), the single-GPU baseline the scaling is measured against.
set -euo pipefail
shared=${TESSERA_SHARED:-../shared}
steps=${STEPS:-60}
# NVLink multicast stays off: on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0

tessera_run() { # label, placement...
  local label=$1; shift
  local out; out=$(mktemp -d)
  # shellcheck disable=SC2086
  tessera train "$@" ${TESSERA_ARGS:-} --data "$shared/data/tinyshakespeare.txt" --tokenizer gpt2 \
    --layers 12 --d-model 768 --heads 12 --seq 1024 --batch 8 --precision bf16 \
    --steps "$steps" --warmup 10 --log-every 10 --eval-every 1000000 \
    --checkpoint-every 1000000 --quiet --out "$out" >/dev/null
  python3 - "$out/metrics.jsonl" "$label" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
label, world = sys.argv[2].split(":")
rate = statistics.median(r["tokens_per_s"] for r in rows[1:])
print(json.dumps({"bench": "train_dp", "who": label, "world_size": int(world),
                  "tokens_per_s": round(rate), "per_gpu": round(rate / int(world))}), flush=True)
PY
  rm -rf "$out"
}

tessera_run "tessera-single:1" --device cuda:0
for n in "$@"; do
  devices=$(seq -s, -f 'cuda:%g' 0 $((n - 1)))
  tessera_run "tessera:$n" --devices "$devices"
  torchrun --standalone --nproc_per_node "$n" "$shared/bench/torch_gpt2.py" train --ddp \
    --dtype bf16 --batch 8 --seq 1024 --iters 20 2>/dev/null | grep '^{'
done

#!/usr/bin/env bash
# MLX-CUDA's tiled gather_qmm reads a row past its activations (engine/model/qmm_guard.py):
# on the H200 on 2026-12-05 every speculative verify on the demo aborted with "an illegal
# memory access was encountered" (compute-sanitizer: qmm_sm80_kernel, a 16-byte read 1 byte
# after a 49,152-byte allocation). This checks the guard there, in one call (~3-4 min once
# the demo's kernels are compiled; compute-sanitizer runs ~100x slower):
#
#   OUT=/root/res/qg scripts/gpu_qmm_guard.sh
#
# Steps (STEPS picks them; DEADLINE_S bounds the whole call):
#   kernel   gpucalls-free repro: gather_qmm over a 49,152-byte bfloat16 x (192 sorted rows of
#            128; 12 unsorted rows), plain and through qmm_guard.with_slack, under
#            compute-sanitizer: OUT/kernel.txt ("ERROR SUMMARY: N errors" for each)
#   sanitize the demo's `bench --speculate oracle:1 --draft-depth 2` (8 tokens) under
#            compute-sanitizer, SSDMOE_QMM_PAD=off then on: OUT/sanitize-{off,on}.txt; read
#            each "ERROR SUMMARY" (expected: errors off, 0 on)
#   dense    resident mlx-lm's own prefill (quantized_matmul, not gathered) at odd lengths
#            under compute-sanitizer: whether the dense path reads past too (not guarded:
#            mlx-lm's layers; upstream ml-explore/mlx#3487): OUT/dense.txt
#   spec     the demo's speculation rows (scripts/gpu_spec.sh step demo, guard on):
#            OUT/spec/demo-summary.txt (targets: oracle auto >= 1.8, chat rows >= 0.97)
# Environment: OUT (/root/res/qg), STEPS (kernel,sanitize,dense,spec), DEADLINE_S (560),
# SANITIZE_MODES (off on), PYTHON (python3), DEMO_COMPILE_S (150), DEMO_ROUNDS (10: the H200 drifts, 6 rounds read auto at 1.03x).
set -u
OUT=${OUT:-/root/res/qg}
STEPS=${STEPS:-kernel,sanitize,dense,spec}
DEADLINE_S=${DEADLINE_S:-560}
TAG=qmm_guard
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
SAN="compute-sanitizer --tool memcheck --print-limit 3"

if want kernel && [ "$(left)" -gt 60 ]; then
  timeout 60 $SAN "$PY" - > "$OUT/kernel.txt" 2>&1 <<'PY'
import mlx.core as mx
from ssdmoe_tui.engine.model import qmm_guard
E, N, D = 32, 256, 128
wq, s, b = mx.quantize(mx.random.normal((E, N, D)).astype(mx.bfloat16), group_size=32, bits=4)
for guarded in (False, True):
    for rows, srt in ((192, True), (12, False)):
        x = mx.random.normal((rows, 1, D)).astype(mx.bfloat16)
        idx = mx.sort(mx.random.randint(0, E, (rows,))).astype(mx.uint32)
        xx = qmm_guard.with_slack(x) if guarded else x
        y = mx.gather_qmm(xx, wq, s, b, rhs_indices=idx, transpose=True, group_size=32,
                          bits=4, sorted_indices=srt)
        mx.eval(y)
        print("guarded", guarded, "rows", rows, "sorted", srt, "ok", flush=True)
PY
  log "kernel exit $?: $(grep -c 'Invalid __global__' "$OUT/kernel.txt") invalid reads"
fi

if want sanitize; then
  for mode in ${SANITIZE_MODES:-off on}; do
    [ "$(left)" -gt 90 ] || { log "sanitize $mode skipped: deadline"; continue; }
    SSDMOE_QMM_PAD=$mode timeout 120 $SAN "$PY" -m ssdmoe_tui.cli bench --speculate oracle:1 \
      --draft-depth 2 --prompt-file scripts/spec_prompts/chat.txt --decode-tokens 8 --rounds 1 \
      > "$OUT/sanitize-$mode.txt" 2>&1
    log "sanitize $mode exit $?: $(grep 'ERROR SUMMARY' "$OUT/sanitize-$mode.txt" | head -1)"
  done
fi

if want dense && [ "$(left)" -gt 90 ]; then
  timeout 120 $SAN "$PY" - > "$OUT/dense.txt" 2>&1 <<'PY'
import mlx.core as mx
from mlx_lm import load
from ssdmoe_tui.models.demo import ensure_demo_model
model, _tok = load(str(ensure_demo_model()))
for n in (9, 17, 36, 48, 63):  # prefill chunks whose rows leave a tile part-filled
    y = model(mx.arange(5, 5 + n)[None])
    mx.eval(y)
    print("prefill", n, "ok", flush=True)
PY
  log "dense exit $?: $(grep 'ERROR SUMMARY' "$OUT/dense.txt" | head -1)"
fi

if want spec && [ "$(left)" -gt 150 ]; then
  STEPS=demo DEMO_ROWS=${DEMO_ROWS:-oracle chat repeat} DEMO_ROUNDS=${DEMO_ROUNDS:-10} DEMO_COMPILE_S=${DEMO_COMPILE_S:-150} \
    DEADLINE_S=$(( $(left) - 5 )) bash "$(dirname "$0")/gpu_spec.sh" "$OUT/spec" > "$OUT/spec.log" 2>&1
  log "spec exit $?"; cat "$OUT/spec/demo-summary.txt" 2>/dev/null | tee -a "$OUT/steps.log" >&2
fi
log "done"

#!/usr/bin/env bash
# Issue 43 item 1 on the H200: what a streamed decode token's router sync is made of, and
# whether decode read-ahead v2 (a few guesses of the next layer's experts into cold slots,
# engine/experts/prefetch.py) pays there. Each step is one `ssdmoe bench --timeline` on the
# Q30 shape (built by `scripts/gpu_pipeline.sh` step q30), 4 GiB cache, one engine, rounds
# alternating read-ahead off / on (each run from an empty cache; medians), writing
# $OUT/timeline-NAME.json (per-layer medians: sync wait, read wait, bytes, hits, misses,
# guesses issued/used, the next-gate prediction's precision; the bare-sync probe) and .txt:
#   model  the model's own routing, K = 8 (router guesses: read-ahead v2)
#   trace  the real Qwen3-30B trace, K = 6 (co-occurrence guesses: read-ahead v1, which
#          `ssdmoe trace replay --prefetch` simulates; a router cannot foresee a trace)
#   managed  (not in the default STEPS) `model` with SSDMOE_SLOT_PLACEMENT=managed (slots in
#          GPU memory, misses migrated by page faults) against host slots
#   device  (not in the default STEPS) `model` with SSDMOE_SLOT_PLACEMENT=device (host slots
#          the reader writes, a device-resident mirror the layers compute from, each miss
#          copied host -> mirror once: engine/experts/mirror.py). With STEPS=model,managed,device
#          one call gives the three placements' per-layer timelines on one machine:
#          timeline-model (host: the step pins it when `device` runs too; alone, `model` runs
#          what `auto` picks), timeline-managed, timeline-device (.json/.txt); the .txt's
#          "mirror:" line and the JSON's modes.*.mirror_mib_per_token / mirror_ms_per_token
#          say what the copies moved and cost; sync_probe.one_layer_compute_ms the hits' side;
#          peak_memory_gib above managed's by about a bank: the copies were not in place
#   compile  (not in the default STEPS) both runs, 1 round x 4 tokens: MLX-CUDA compiles the
#          K = 8 and K = 6 shapes, read-ahead on and off, before anything is timed
#   compile_model  (not in the default STEPS) the K = 8 model-routing run of `compile` alone,
#          bound by DEADLINE_S (on the H100 the model run compiled for more than 77 s)
#   compile_device  (not in the default STEPS) the same short run under `device` placement:
#          the mirror's row copies add MLX-CUDA's gather and scatter kernels (JIT-compiled on
#          first use; the `device` step's uncounted warm-up run compiles them otherwise)
# Call 1 (cold machine): the Q30 build, then the compile pass:
#
#   STEPS=q30 bash scripts/gpu_pipeline.sh $OUT/build && STEPS=compile bash scripts/gpu_timeline.sh
#
# Call 2 (<= 8 minutes): OUT=... DEADLINE_S=470 bash scripts/gpu_timeline.sh
#
# The placements side by side (issue 43 item 1 (c), one warm call after the compile pass;
# each step gets its share of DEADLINE_S, read-ahead off/on alternating as above):
#
#   OUT=... DEADLINE_S=150 STEPS=compile_model,compile_device bash scripts/gpu_timeline.sh
#   OUT=... DEADLINE_S=560 STEPS=model,managed,device bash scripts/gpu_timeline.sh
#
# Environment: Q30 (/root/q30), CACHE (4G), ROUNDS (3), DECODE (32), STEPS (model,trace),
# SSDMOE_PREFETCH_TOP / SSDMOE_PREFETCH_COLD (the governor's guesses a layer, cold tokens).
set -u
OUT=${OUT:-/root/res/tl}
STEPS=${STEPS:-model,trace}
DEADLINE_S=${DEADLINE_S:-470}
TAG=timeline
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
CACHE=${CACHE:-4G}
ROUNDS=${ROUNDS:-3}
DECODE=${DECODE:-32}

one() {  # one NAME SECONDS [bench args...]
  local name=$1 secs=$2; shift 2
  [ "$(left)" -gt 60 ] || { log "$name skipped: deadline"; return; }
  (( secs > $(left) - 10 )) && secs=$(( $(left) - 10 ))
  log "$name: bench --timeline, cache $CACHE, $ROUNDS rounds x $DECODE tokens, $*"
  timeout "$secs" "$PY" -m ssdmoe_tui.cli bench --timeline --prefetch both --model "$Q30" \
    --expert-cache "$CACHE" --rounds "$ROUNDS" --prompt-tokens 64 --decode-tokens "$DECODE" \
    "$@" --json "$OUT/timeline-$name.json" > "$OUT/timeline-$name.txt" 2> "$OUT/timeline-$name.err"
  log "$name exit $?"
}

[ -f "$Q30/config.json" ] || { log "no checkpoint at $Q30: run scripts/gpu_pipeline.sh step q30 first"; exit 1; }
if want compile_model; then  # the model-routing shapes only (steps model, managed)
  ROUNDS=1 DECODE=4 one compile-model "$(( $(left) - 10 ))" --k 8
fi
if want compile_device; then  # the mirror's gather / scatter kernels (step device)
  SSDMOE_SLOT_PLACEMENT=device ROUNDS=1 DECODE=4 one compile-device "$(( $(left) - 10 ))" --k 8
fi
if want compile; then
  ROUNDS=1 DECODE=4 one compile-model "$(( $(left) / 2 ))" --k 8
  ROUNDS=1 DECODE=4 one compile-trace "$(( $(left) - 10 ))" --k 6 --routing-trace "$TRACE"
fi
if want model; then  # a third of the time when two placements follow it, else half
  if want managed && want device; then secs=$(( $(left) / 3 )); else secs=$(( $(left) / 2 )); fi
  # beside `device` and `managed`, `model` is the host row (`auto` mirrors small caches
  # on the device since the H100's side by side of 2026-12-06); alone, what `auto` picks
  if want device; then
    SSDMOE_SLOT_PLACEMENT=host one model "$secs" --k 8
  else
    one model "$secs" --k 8
  fi
fi
if want trace; then one trace "$(( $(left) - 10 ))" --k 6 --routing-trace "$TRACE"; fi
# The same model-routing timeline with the slots in GPU memory (`managed`): 2026-12-05's
# H100 run (host slots) showed the sync is the layer's compute reading host slots over
# PCIe (1.22 ms behind a layer, 0.07 ms bare); this says what HBM-resident hits buy and
# what the page-fault migration of the misses costs, per layer (issue 43 item 1 c).
if want managed; then
  if want device; then secs=$(( $(left) / 2 )); else secs=$(( $(left) - 10 )); fi
  SSDMOE_SLOT_PLACEMENT=managed one managed "$secs" --k 8
fi
# The slots the reader writes stay on the host; the layers compute from a device mirror
# that gets each miss's rows copied over once (`device`): does it keep managed's
# 0.21 ms a layer for the hits without managed's page faults on the misses?
if want device; then
  SSDMOE_SLOT_PLACEMENT=device one device "$(( $(left) - 10 ))" --k 8
fi
tail -n 3 "$OUT"/timeline-*.txt >&2

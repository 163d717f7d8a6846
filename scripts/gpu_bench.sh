#!/usr/bin/env bash
# On-device part of the GPU benchmark (docs/benchmarks.md, "GPU"): run on the H200
# machine from the repository root, with mlx-cuda, mlx-lm and platformdirs importable
# (see ../shared/tools/device-mlx-cuda.md for the wheels).
#
#   scripts/gpu_bench.sh OUTDIR
#
# Steps, each writing into OUTDIR as it finishes (partial results survive a timeout):
#   1. build the random Qwen3.5-35B-A3B-shaped checkpoint (real config, all 40 layers
#      unless LAYERS is set) at MODEL, unless it exists;
#   2. plain resident mlx-lm on the same checkpoint, uncapped (the whole model must be
#      resident, which is what the cap forbids), for the ratio;
#   3. `ssdmoe bench --cold` at K=8,4,2 with a 4 GiB expert cache, inside a cgroup
#      capped at CAP_GIB of host memory (page cache included), memory split sampled;
#   4. `ssdmoe bench` warm (page cache dropped once, then kept), inside the same cap.
#   P. (only when STEPS names it) a short uncapped K=8 bench per slot placement
#      (docs/benchmarks.md, "Slot placement"); the faster one is written to
#      OUTDIR/placement.txt, and later steps use it unless SSDMOE_SLOT_PLACEMENT is set.
#   R. (only when STEPS names it) `ssdmoe repack`, then the cold capped bench once per
#      expert source (`--experts repacked`, then `shards`): cold-repacked.json and
#      cold-shards.json (docs/benchmarks.md, "Repacked experts").
#   H. (only when STEPS names it) `hold`: a budget that holds every expert (HOLD_CACHE,
#      64G: clamped to the expert set), uncapped, warm, against the resident baseline.
# BENCH_ARGS: extra `ssdmoe bench` arguments, e.g. "--routing-trace FILE" (trace-driven).
# STEPS (build,resident,cold,warm) picks steps, so one warm machine can run them over
# two calls: STEPS=build,resident,placement then STEPS=cold,warm.
# Environment: MODEL (/root/q35), CONFIG (.benchcfg/q35/config.json), TOKENIZER
# (.benchcfg/qwen3-tokenizer), LAYERS (all), CAP_GIB (16), CACHE (4G), KS (8,4,2),
# PROMPT_TOKENS (32), DECODE_TOKENS (48), DEADLINE_S (560: steps that cannot finish
# before it are skipped and say so), PYTHON (python3).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_bench.sh OUTDIR}
MODEL=${MODEL:-/root/q35}
CONFIG=${CONFIG:-.benchcfg/q35/config.json}
TOKENIZER=${TOKENIZER:-.benchcfg/qwen3-tokenizer}
CAP_GIB=${CAP_GIB:-16}
CACHE=${CACHE:-4G}
KS=${KS:-8,4,2}
PROMPT_TOKENS=${PROMPT_TOKENS:-32}
DECODE_TOKENS=${DECODE_TOKENS:-48}
DEADLINE_S=${DEADLINE_S:-560}
STEPS=${STEPS:-build,resident,cold,warm}
TAG=gpu_bench
# the step filter, deadline, log, env.txt, PY and the cgroup helpers (make_cg, run_capped,
# sample_cg, stop_sampler): one copy
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
cat "$OUT/env.txt" >&2

# ---- 1. checkpoint
if want build && [ ! -f "$MODEL/config.json" ]; then
  log "building $MODEL from $CONFIG${LAYERS:+ ($LAYERS layers)}"
  t0=$(date +%s)
  timeout "$(( $(left) - 200 ))" "$PY" -m ssdmoe_tui.cli demo-model --config "$CONFIG" --out "$MODEL" \
    ${LAYERS:+--layers "$LAYERS"} --tokenizer "$TOKENIZER" --shard-size 4G 2>&1 | tee "$OUT/build.log" >&2
  rc=${PIPESTATUS[0]}
  log "build exit $rc after $(( $(date +%s) - t0 )) s; $(du -sh "$MODEL" | cut -f1)"
  [ "$rc" = 0 ] || { log "checkpoint build failed or timed out"; exit 1; }
fi
sync

read -ra extra <<< "${BENCH_ARGS:-}"  # e.g. "--routing-trace FILE" (trace-driven routing)
bench=("$PY" -m ssdmoe_tui.cli bench --model "$MODEL" --k "$KS" --prompt-tokens "$PROMPT_TOKENS"
  --decode-tokens "$DECODE_TOKENS" "${extra[@]}")
# capped NAME SECONDS WHAT [BENCH_ARGS...]: one bench with the CACHE expert cache under the
# CAP_GIB cap, against the resident baseline when it ran, into OUTDIR/NAME.{json,txt,err,mem}
capped() {
  local name=$1 secs=$2 what=$3; shift 3
  make_cg "ssdmoe-bench-$name" "$CAP_GIB"; sample_cg "$OUT/$name.mem"
  log "$what, cap $CAP_GIB GiB, cache $CACHE"
  run_capped "$secs" "${bench[@]}" --expert-cache "$CACHE" "$@" --baseline skip "${base[@]}" \
    --json "$OUT/$name.json" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  log "$name exit $?; cgroup peak $(cat "$peak_file" 2>/dev/null)"
  stop_sampler
}

# ---- 2. resident mlx-lm, uncapped (the whole model must be resident: the cap forbids it)
if ! want resident; then :
elif [ "$(left)" -gt 60 ]; then
  log "resident mlx-lm baseline (uncapped)"
  timeout "$(( $(left) - 30 ))" "${bench[@]}" --baseline-only --json "$OUT/resident.json" \
    > "$OUT/resident.txt" 2> "$OUT/resident.err"
  rc=$?
  if grep -q '"status": "cannot run' "$OUT/resident.json" 2>/dev/null; then
    log "auto refused ($(grep -o 'cannot run[^"]*' "$OUT/resident.json")); forcing: the GPU has 139 GiB and the host 128 GiB"
    timeout "$(( $(left) - 30 ))" "${bench[@]}" --baseline force --baseline-only --json "$OUT/resident.json" \
      > "$OUT/resident.txt" 2> "$OUT/resident.err"
    rc=$?
  fi
  log "resident exit $rc"
else log "resident baseline skipped: deadline"; fi
# ---- P. slot placement on MLX-CUDA: a short K=8 run per placement, uncapped
if want placement; then
  best=""; best_ms=""
  for p in managed host; do
    [ "$(left)" -gt 60 ] || { log "placement $p skipped: deadline"; continue; }
    log "placement $p"
    SSDMOE_SLOT_PLACEMENT=$p timeout "$(( $(left) - 20 ))" "$PY" -m ssdmoe_tui.cli bench --model "$MODEL" \
      --k 8 --prompt-tokens 16 --decode-tokens 24 --expert-cache "$CACHE" --baseline skip \
      --json "$OUT/placement-$p.json" > "$OUT/placement-$p.txt" 2> "$OUT/placement-$p.err"
    ms=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["configs"][0]; print(r["ms_per_token"]["total"])' \
      "$OUT/placement-$p.json" 2>/dev/null)
    log "placement $p: decode ${ms:-?} ms/token"
    if [ -n "$ms" ] && { [ -z "$best_ms" ] || "$PY" -c "import sys; sys.exit(0 if $ms < $best_ms else 1)"; }; then
      best=$p; best_ms=$ms
    fi
  done
  [ -n "$best" ] && echo "$best" > "$OUT/placement.txt" && log "faster placement: $best"
fi
if [ -z "${SSDMOE_SLOT_PLACEMENT:-}" ] && [ -f "$OUT/placement.txt" ]; then
  export SSDMOE_SLOT_PLACEMENT=$(cat "$OUT/placement.txt")
fi
log "slot placement for the benches: ${SSDMOE_SLOT_PLACEMENT:-auto}"

base=(); grep -q '"status": "ran"' "$OUT/resident.json" 2>/dev/null && base=(--baseline-json "$OUT/resident.json")

# ---- 3. cold, capped
if ! want cold; then :
elif [ "$(left)" -gt 60 ]; then
  capped cold "$(( $(left) * 3 / 5 ))" "cold bench" --cold
else log "cold bench skipped: deadline"; fi

# ---- R. repacked experts against the shards, cold and capped
if want repack; then
  if [ "$(left)" -gt 120 ]; then
    log "repacking $MODEL"
    t0=$(date +%s)
    timeout "$(( $(left) - 60 ))" "$PY" -m ssdmoe_tui.cli repack --model "$MODEL" --json > "$OUT/repack.json" 2> "$OUT/repack.err"
    log "repack exit $? after $(( $(date +%s) - t0 )) s: $(cat "$OUT/repack.json")"
  fi
  for src in repacked shards; do
    if [ "$(left)" -gt 60 ]; then
      capped "cold-$src" "$(( $(left) - 10 ))" "cold bench, experts from $src" --cold --experts "$src"
    else log "cold $src skipped: deadline"; fi
  done
fi

# ---- 4. warm, capped (page cache dropped once, so the cap decides what stays cached)
if ! want warm; then :
elif [ "$(left)" -gt 60 ]; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  capped warm "$(( $(left) - 10 ))" "warm bench"
else log "warm bench skipped: deadline"; fi
# ---- H. a budget that holds every expert, uncapped, against the resident baseline
if want hold; then
  if [ "$(left)" -gt 60 ]; then
    log "hold-everything bench (expert cache ${HOLD_CACHE:-64G}, uncapped, warm)"
    timeout "$(( $(left) - 10 ))" "${bench[@]}" --expert-cache "${HOLD_CACHE:-64G}" --baseline skip "${base[@]}" \
      --json "$OUT/hold.json" > "$OUT/hold.txt" 2> "$OUT/hold.err"
    log "hold exit $?"
  else log "hold skipped: deadline"; fi
fi
log "done"

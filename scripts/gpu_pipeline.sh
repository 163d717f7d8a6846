#!/usr/bin/env bash
# Issue 29's H200 measurements (the pipelined layer, slot placement, long prefill, tokens):
#
#   scripts/gpu_pipeline.sh OUTDIR
#
# About 8 minutes of GPU wall time on a warm machine with /root/q30 built (DEADLINE_S=480
# by default: a step that cannot finish in time is skipped and says so in steps.log; each
# step writes into OUTDIR as it finishes, so a timeout keeps what ran). Run it from the
# repository root with the MLX-CUDA wheels installed and `.benchcfg` carried, as
# scripts/gpu_speed.sh. A cold machine adds the q30 build (~45 s) and the kernel compile.
#
# Steps (STEPS picks them, in this order; default q30,compile,pipe,prefill,exact: ~7-8 min):
#   q30      build the Qwen3-30B-A3B-shaped checkpoint at Q30 if it is not there (~45 s)
#   compile  uncapped short trace-driven run (2G, 8 tokens): kernels compiled before
#            any capped run measures (or is OOM-killed by) the compilation
#   pipe     trace-driven decode (qwen.route.csv, K = 6), cold, `--pipeline both`: each
#            cache serial and pipelined in one process (4G serial first, 2G pipelined first
#            since the sixth session of 2026-12-06), 4G then 2G, one process under a
#            CAP_GIB (8) cap and one under CAP12_GIB (12); slots as `auto` places them
#            (under these caps the 16 GiB of experts cannot stay cached: host slots since
#            the seventh session of 2026-12-06; a device mirror in the fifth and sixth,
#            host before); decode/ceiling in achieved_over_ceiling
#   modelcold (not in the default STEPS) the model's own routing, K = 8, 4G then 2G, cold,
#            under the CAP12_GIB cap, decode read-ahead off / on (`--prefetch both`), one
#            process with host slots and one with `device` (a mirror): where the disk and
#            the router sync both count, which placement wins (modelcold-host/-device);
#            MODELCOLD_WAYS picks the placements, in order ("host device")
#   prefill  4096-token prompt, chunk 4096, 4G cache, uncapped, resident mlx-lm in the
#            same call: warm (page cache filled), then cold (--cold); `auto` everything
#            (a device mirror of the slots, each chunk's misses copied to it; under host
#            slots, SSDMOE_SLOT_PLACEMENT=host, chunks compute from a device copy of their
#            union: staged_calls; the next layer's union read ahead), then cold with
#            SSDMOE_PREFILL_READAHEAD=off
#   exact    greedy tokens, resident mlx-lm vs the engine at 4G and 2G (pipelined layer,
#            full-shape calls) and at 4G with the pipeline off (exact.jsonl)
#   place    the same trace-driven runs as `pipe`, pipelined, with managed slots
#            (SSDMOE_SLOT_PLACEMENT=managed), under both caps: against pipe's host runs
#   prefetch trace-driven, 4G, cold, CAP12_GIB cap, pipelined, `--prefetch both`: the
#            co-occurrence read-ahead's precision, recall and net tok/s against off
#   split    (runs last) the `pipe` runs under the 12 GiB cap, pipelined, with SSDMOE_READ_SPLIT=256K (a
#            layer's 1-2 misses cut into more, smaller reads in flight): against pipe-cap12
#   q35      build the Qwen3.5-35B-A3B shape at Q35 (~45 s)
#   sweep    uniform routing on Q35, K 8,4,2, 4G, cold, CAP12_GIB cap, pipelined
#   exact35  greedy tokens on Q35 at 4G (pipelined) against resident mlx-lm
# A second call for the rest (~7 min; placement, read-ahead, the uniform K sweep and the
# Qwen3.5 tokens of "Done when"):
#   STEPS=place,prefetch,q35,sweep,exact35,split scripts/gpu_pipeline.sh OUTDIR2
# (split last: skipped if the deadline comes first).
# Environment: Q30 (/root/q30), Q35 (/root/q35), CAP_GIB (8), CAP12_GIB (12),
# DEADLINE_S (480), PYTHON (python3), STEPS, DECODE (40: decode tokens per trace config),
# PREFILL_TOKENS (4096; the issue's 16k prompt: PREFILL_TOKENS=16384 PREFILL_MODES="warm cold"
# STEPS=prefill, files prefill-MODE-16384.*), PREFILL_STEP (4096: the chunk), PREFILL_MODES.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_pipeline.sh OUTDIR}
DEADLINE_S=${DEADLINE_S:-480}
DECODE=${DECODE:-40}
STEPS=${STEPS:-q30,compile,pipe,prefill,exact}
TAG=gpu_pipeline
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"

# capped NAME GIB SECONDS_NEEDED [ENV=VALUE...] -- BENCH_ARGS: one cold Q30 bench, caches
# 4G,2G, a 32-token prompt, DECODE tokens, under a GIB memory cap
capped() {
  local name=$1 gib=$2 need=$3; shift 3
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  [ "$(left)" -gt "$need" ] || { log "$name skipped: deadline ($(left) s left)"; return; }
  make_cg "ssdmoe-$name" "$gib"; sample_cg "$OUT/$name.mem"
  log "$name: 4G,2G cold, cap $gib GiB ${envs[*]} $*"
  run_capped "$(( $(left) - 5 ))" env "${envs[@]}" "$PY" -m ssdmoe_tui.cli bench --model "$Q30" \
    --expert-cache 4G,2G --prompt-tokens 32 \
    --decode-tokens "$DECODE" --disk-mib 256 --baseline skip --cold --wide "$@" \
    --json "$OUT/$name.json" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  log "$name exit $?; cgroup peak $(cat "$cg/memory.peak" 2>/dev/null)"
  stop_sampler
}
# traced NAME GIB SECONDS_NEEDED [ENV=VALUE...] -- BENCH_ARGS: the same, routed by the
# real trace at its K = 6
traced() {
  local name=$1 gib=$2 need=$3; shift 3
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  capped "$name" "$gib" "$need" "${envs[@]}" -- --routing-trace "$TRACE" --k 6 "$@"
}

if want q30; then build "$Q30" .benchcfg/q30/config.json "$(( $(left) - 60 ))"; fi
if want compile; then
  log "compile: uncapped short trace-driven run"
  timeout "$(( $(left) > 150 ? 150 : $(left) ))" "$PY" -m ssdmoe_tui.cli bench --model "$Q30" \
    --routing-trace "$TRACE" --k 6 --expert-cache 2G --prompt-tokens 32 --decode-tokens 8 \
    --disk-mib 64 --baseline skip --pipeline both > "$OUT/compile.txt" 2>&1
  log "compile exit $?"
fi
if want pipe; then
  traced pipe-cap12 "$CAP12_GIB" 80 -- --pipeline both
  traced pipe-cap8 "$CAP_GIB" 80 -- --pipeline both
fi
if want modelcold; then
  for way in ${MODELCOLD_WAYS:-host device}; do
    capped "modelcold-$way" "$CAP12_GIB" 80 SSDMOE_SLOT_PLACEMENT="$way" -- --k 8 --prefetch both
  done
fi
if want prefill; then
  ptok=${PREFILL_TOKENS:-4096}; pstep=${PREFILL_STEP:-4096}
  ptag=""; [ "$ptok" = 4096 ] || ptag="-$ptok"  # e.g. prefill-warm-16384.json
  for mode in ${PREFILL_MODES:-warm cold cold-noreadahead}; do
    [ "$(left)" -gt 60 ] || { log "prefill-$mode skipped: deadline"; continue; }
    cold=(); [ "$mode" != warm ] && cold=(--cold)
    ra=auto; [ "$mode" = cold-noreadahead ] && ra=off
    log "prefill-$mode$ptag: $ptok tokens, chunk $pstep, 4G, resident in the same call"
    SSDMOE_PREFILL_READAHEAD=$ra timeout "$(( $(left) - 5 ))" "$PY" -m ssdmoe_tui.cli bench \
      --model "$Q30" --k 8 \
      --expert-cache 4G --prompt-tokens "$ptok" --prefill-step "$pstep" --decode-tokens 4 \
      --disk-mib 256 --baseline force "${cold[@]}" --wide --json "$OUT/prefill-$mode$ptag.json" \
      > "$OUT/prefill-$mode$ptag.txt" 2> "$OUT/prefill-$mode$ptag.err"
    log "prefill-$mode$ptag exit $?"
  done
fi
if want exact; then
  if [ "$(left)" -gt 60 ]; then
    log "exact: resident vs 4G, 2G pipelined (full-shape calls), then 4G serial"
    timeout "$(( $(left) - 5 ))" "$PY" scripts/gpu_exact_large_cache.py --model "$Q30" \
      --configs 4G,2G --tokens 24 --out "$OUT/exact.jsonl" > "$OUT/exact.txt" 2>&1
    log "exact exit $?"
    if [ "$(left)" -gt 30 ]; then
      SSDMOE_PIPELINE=off timeout "$(( $(left) - 5 ))" "$PY" scripts/gpu_exact_large_cache.py \
        --model "$Q30" --configs 4G --tokens 24 --reference "$OUT/exact.jsonl" \
        --out "$OUT/exact-serial.jsonl" >> "$OUT/exact.txt" 2>&1
      log "exact serial exit $?"
    fi
  else log "exact skipped: deadline"; fi
fi
if want place; then
  traced place-managed-cap12 "$CAP12_GIB" 70 SSDMOE_SLOT_PLACEMENT=managed --
  traced place-managed-cap8 "$CAP_GIB" 70 SSDMOE_SLOT_PLACEMENT=managed --
fi
if want prefetch; then
  traced prefetch-cap12 "$CAP12_GIB" 100 -- --prefetch both
fi
if want q35; then build "$Q35" .benchcfg/q35/config.json "$(( $(left) - 60 ))"; fi
if want sweep; then sweep_q35 5 pipelined; fi
if want exact35; then
  if [ "$(left)" -gt 60 ]; then
    log "exact35: resident vs 4G pipelined on Q35"
    timeout "$(( $(left) - 5 ))" "$PY" scripts/gpu_exact_large_cache.py --model "$Q35" \
      --configs 4G --tokens 24 --out "$OUT/exact35.jsonl" > "$OUT/exact35.txt" 2>&1
    log "exact35 exit $?"
  else log "exact35 skipped: deadline"; fi
fi
if want split; then
  traced split-cap12 "$CAP12_GIB" 80 SSDMOE_READ_SPLIT=256K --
fi
# One line per configuration: what the issue's "Done when" reads.
"$PY" - "$OUT" <<'EOF' > "$OUT/summary.txt" 2>&1
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    try:
        r = json.loads(f.read_text())
    except ValueError:
        continue
    for c in r.get("configs", []):
        print(f.stem, f"K={c['k']}", c["expert_cache"], c.get("slot_placement"),
              "pipelined" if c.get("pipeline") else "serial", f"hit {c['hit_rate']:.3f}",
              f"decode {c['decode_tok_s']:.2f}", f"ceiling {c.get('io_ceiling_tok_s')}",
              f"ach {c.get('achieved_over_ceiling')}", f"prefill {c['prefill_tok_s']:.1f}",
              f"x res {c.get('ratio_prefill_vs_resident')}",
              f"over bound {c.get('prefill_time_over_bound')}",
              f"staged {c.get('staged_calls')}", f"pipelined {c.get('pipelined_calls')}",
              f"prestaged {c.get('prestaged_calls')} ({c.get('prestaged_experts')} experts,"
              f" {c.get('prestage_missed_experts')} gathered after)",
              "peak MLX GiB prefill " + (f"{c['prefill_peak_mlx_memory_bytes'] / 2**30:.2f}"
                                         if c.get("prefill_peak_mlx_memory_bytes") else "-")
              + f" turn {c.get('peak_mlx_memory_bytes', 0) / 2**30:.2f}",
              *([f"mirror {m['rows']} rows {m['sync_s']} s"]
                if (m := c.get("slot_mirror")) else []),
              *([f"prefetch precision {c.get('prefetch_precision')}",
                 f"recall {c.get('prefetch_recall')}",
                 f"x off {c.get('prefetch_decode_vs_off')}"] if c.get("prefetch") else []))
EOF
cat "$OUT/summary.txt" >&2
log "done"

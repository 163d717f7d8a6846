#!/usr/bin/env bash
# Issue 19's H200 measurements in one or two device calls (docs/benchmarks.md, "History"):
#
#   scripts/gpu_speed.sh OUTDIR
#
# Steps (STEPS picks them; each writes into OUTDIR as it finishes, so a timeout keeps
# what ran; a step that cannot finish before DEADLINE_S is skipped and says so):
#   q30    build the random Qwen3-30B-A3B-shaped checkpoint (48 layers) at Q30
#   quick  `ssdmoe bench --quick` on it, uncapped: resident mlx-lm, a QUICK_CACHE cache and
#          every expert held, alternating in one process (medians), prefill included, plus
#          the per-MoE-layer costs (graph build, nodes, host round trip)
#   trace  (after an uncapped compile pass) trace-driven (qwen.route.csv, K = 6) under a CAP_GIB host-memory cap: warm
#          first, then cold (the order of the last round reversed: a fresh process's
#          kernel compilation then falls on the warm run, which tells whether the extra
#          anonymous memory of cold runs is the engine's or the JIT's), 4G then 2G; the
#          cgroup's anon/file split sampled every 2 s
#          TRACE_RUNS (warm-4G split-4G cold-4G cold-2G) orders them; split-4G: warm 4G
#          with SSDMOE_READ_SPLIT=256K (a layer's 1-2 misses cut into more reads)
#   q35    build the Qwen3.5-35B-A3B shape (40 layers) at Q35
#   sweep  uniform K sweep (8,4,2) cold on Q35, 4G cache, host slots, CAP12_GIB cap
# Environment: Q30 (/root/q30), Q35 (/root/q35), CAP_GIB (8), CAP12_GIB (12), QUICK_CACHE (4G),
# DEADLINE_S (570), PYTHON (python3), STEPS (q30,quick,trace), TRACE_RUNS.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_speed.sh OUTDIR}
QUICK_CACHE=${QUICK_CACHE:-4G}
DEADLINE_S=${DEADLINE_S:-570}
STEPS=${STEPS:-q30,quick,trace}
TAG=gpu_speed
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"

# trace NAME CACHE MODE(warm|cold) [ENV=VALUE]: one trace-driven bench under the cap
trace_run() {
  local name=$1 cache=$2 mode=$3; shift 3
  [ "$(left)" -gt 70 ] || { log "$name skipped: deadline"; return; }
  local cold=(); [ "$mode" = cold ] && cold=(--cold)
  [ "$mode" = warm ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  make_cg "ssdmoe-$name" "$CAP_GIB"; sample_cg "$OUT/$name.mem"
  log "$name: trace-driven, cache $cache, $mode, cap $CAP_GIB GiB $*"
  run_capped "$(( $(left) - 10 ))" env "$@" "$PY" -m ssdmoe_tui.cli bench --model "$Q30" \
    --routing-trace "$TRACE" --k 6 --expert-cache "$cache" --prompt-tokens 32 --decode-tokens 96 \
    --disk-mib 256 --baseline skip "${cold[@]}" --wide --json "$OUT/$name.json" \
    > "$OUT/$name.txt" 2> "$OUT/$name.err"
  log "$name exit $?; cgroup peak $(cat "$cg/memory.peak" 2>/dev/null)"
  stop_sampler
}

if want q30; then build "$Q30" .benchcfg/q30/config.json "$(( $(left) - 300 ))"; fi
if want quick; then
  if [ "$(left)" -gt 200 ]; then
    log "quick: resident / $QUICK_CACHE / every expert held, alternating, uncapped"
    timeout "$(( $(left) - 110 ))" "$PY" -m ssdmoe_tui.cli bench --quick --model "$Q30" \
      --expert-cache "$QUICK_CACHE" --rounds 5 --prompt-tokens 128 --decode-tokens 32 \
      --json "$OUT/quick-q30.json" > "$OUT/quick-q30.txt" 2> "$OUT/quick-q30.err"
    log "quick exit $?"
  else log "quick skipped: deadline"; fi
fi
if want trace; then
  # The process that first meets these kernel shapes compiles them and holds ~3 GiB more
  # anonymous memory meanwhile (4.5 against 1.3 GiB, 2026-12-02): a short uncapped run
  # compiles them, so no capped run measures (or is OOM-killed by) the compilation.
  log "trace: uncapped compile pass"
  timeout 240 "$PY" -m ssdmoe_tui.cli bench --model "$Q30" --routing-trace "$TRACE" --k 6 \
    --expert-cache 2G --prompt-tokens 32 --decode-tokens 8 --disk-mib 64 --baseline skip \
    > "$OUT/trace-compile.txt" 2>&1
  log "trace compile pass exit $?"
  for r in ${TRACE_RUNS:-warm-4G split-4G cold-4G cold-2G}; do
    case $r in
      split-*) trace_run "trace-$r" "${r#split-}" warm SSDMOE_READ_SPLIT=256K ;;
      *) trace_run "trace-$r" "${r#*-}" "${r%%-*}" ;;
    esac
  done
fi
if want q35; then build "$Q35" .benchcfg/q35/config.json "$(( $(left) - 150 ))"; fi
if want sweep; then sweep_q35 10; fi
log "done"

# bash .../split.sh trace   (~8 min at END=540)   |   bash .../split.sh q35   (~9 min)
# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and ../../2026-12-07-h100-tenth/calls/stash.sh
# (.whlB), each right after the last (on a machine that ran v4.sh or trace-host.sh the
# install and Q30 are no-ops). Split reads (SSDMOE_READ_SPLIT=256K: a 3 MB expert as ~12
# reads in flight) were never run on a GPU machine's disk; where a layer misses 1-2
# experts its reads run one or two at a time (latency-bound), which is what holds
#   trace: the real Qwen3-30B trace, K = 6, 4 GiB, at 61 % of the ceiling (H100 sixth
#          session, host slots, 12 GiB cap; target 90 %), `--pipeline both`;
#   q35:   the uniform Qwen3.5 shape at K = 4 / 2, 4 GiB, at 73 / 44 % (H100 fourth
#          session, 12 GiB cap; targets 90 / 85 %), Q35 built first (~45 s).
# Processes alternate split off / 256K, host slots, the 12 GiB cap, cold, after an
# uncapped short compile pass: `achieved_over_ceiling` per process and configuration.
WHAT=${1:?usage: split.sh trace|q35}
T0=$(date +%s); RET=$OUT  # the folder that comes back
bash scripts/gpu_install.sh > /root/inst.log 2>&1 || { tail -5 /root/inst.log; exit 1; }
source scripts/gpu_env.sh
export SSDMOE_SLOT_PLACEMENT=host
D=/root/res/split-$WHAT; mkdir -p $D
if [ "$WHAT" = trace ]; then
  [ -d /root/q30 ] || STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh $D/build > $D/build.log 2>&1
  STEPS=compile DEADLINE_S=160 bash scripts/gpu_pipeline.sh $D/compile > $D/compile.log 2>&1
  ARGS=(--model /root/q30 --routing-trace tests/fixtures/traces/bigmoeonedge-route-trace/2026-07-15-route-trace/qwen.route.csv
        --k 6 --decode-tokens 40 --pipeline both)
else
  [ -d /root/q35 ] || STEPS=q35 DEADLINE_S=150 bash scripts/gpu_pipeline.sh $D/build > $D/build.log 2>&1
  timeout 150 python3 -m ssdmoe_tui.cli bench --model /root/q35 --k 4,2 --expert-cache 4G \
    --prompt-tokens 32 --decode-tokens 8 --disk-mib 64 --baseline skip > $D/compile.txt 2>&1
  ARGS=(--model /root/q35 --k 4,2 --decode-tokens 32)
fi
echo "$WHAT built and compiled +$(( $(date +%s)-T0 ))s"
OUT=$D STEPS=none DEADLINE_S=600 TAG=split; source scripts/gpu_common.sh
for i in 1 2 3 4 5 6; do
  left=$(( ${END:-560} - ($(date +%s)-T0) )); [ $left -lt 100 ] && break
  split=off; [ $((i % 2)) -eq 0 ] && split=256K
  make_cg "ssdmoe-split-$i" 12
  run_capped $(( left < 150 ? left - 5 : 145 )) env SSDMOE_READ_SPLIT=$split python3 -m ssdmoe_tui.cli bench \
    "${ARGS[@]}" --expert-cache 4G --prompt-tokens 32 --disk-mib 256 --baseline skip --cold --wide \
    --json $D/run-$i-$split.json > $D/run-$i-$split.txt 2>&1
  echo "$WHAT $i $split exit $? +$(( $(date +%s)-T0 ))s peak $(cat "$cg/memory.peak" 2>/dev/null)"
  python3 docs/measurements/2026-12-07-cpu-fourteenth/calls/configs.py $D/run-$i-$split.json
done
cd /root/res && tar czf "$RET/split-$WHAT.tgz" split-$WHAT; ls "$RET"

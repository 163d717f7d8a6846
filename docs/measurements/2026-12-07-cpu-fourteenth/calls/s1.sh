# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and ../../2026-12-07-h100-tenth/calls/stash.sh
# (.whlB), each right after the last (a machine that ran v4.sh or trace-host.sh: install
# and Q30 are no-ops). The trace's 4 GiB done-when (>= 90 % of the ceiling; H100 sixth
# session 61 % under the 12 GiB cap, host slots, serial): at 4 GiB a layer misses 1-2
# experts, read one or two at a time (latency-bound); split reads (SSDMOE_READ_SPLIT=256K:
# a 3 MB expert as ~12 reads in flight) were never run on a GPU machine's disk. Processes
# alternate split off / 256K, host slots, the 12 GiB cap, cold, `--pipeline both` (each
# order alternating inside the process): `achieved_over_ceiling` of each, same tokens.
# ~8 min at END=540 (each process ~70-90 s).
T0=$(date +%s); RET=$OUT  # the folder that comes back
bash scripts/gpu_install.sh > /root/inst.log 2>&1 || { tail -5 /root/inst.log; exit 1; }
source scripts/gpu_env.sh
export SSDMOE_SLOT_PLACEMENT=host
[ -d /root/q30 ] || STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 +$(( $(date +%s)-T0 ))s"
# the compile pass (uncapped): a no-op in time where the trace's kernels are compiled
STEPS=compile DEADLINE_S=160 bash scripts/gpu_pipeline.sh /root/res/s1c > /root/res/s1c.log 2>&1
echo "compile +$(( $(date +%s)-T0 ))s"
OUT=/root/res/s1 STEPS=none DEADLINE_S=600 TAG=s1; source scripts/gpu_common.sh
for i in 1 2 3 4 5 6; do
  left=$(( ${END:-540} - ($(date +%s)-T0) )); [ $left -lt 100 ] && break
  split=off; [ $((i % 2)) -eq 0 ] && split=256K
  make_cg "ssdmoe-s1-$i" 12
  run_capped $(( left < 120 ? left - 5 : 115 )) env SSDMOE_READ_SPLIT=$split python3 -m ssdmoe_tui.cli bench \
    --model /root/q30 --routing-trace "$TRACE" --k 6 --expert-cache 4G --prompt-tokens 32 \
    --decode-tokens 40 --disk-mib 256 --baseline skip --cold --wide --pipeline both \
    --json /root/res/s1/split-$i-$split.json > /root/res/s1/split-$i-$split.txt 2>&1
  echo "s1 $i $split exit $? +$(( $(date +%s)-T0 ))s peak $(cat "$cg/memory.peak" 2>/dev/null)"
  python3 docs/measurements/2026-12-07-cpu-fourteenth/calls/configs.py /root/res/s1/split-$i-$split.json
done
cd /root/res && tar czf "$RET/s1.tgz" s1 s1c s1c.log; ls "$RET"

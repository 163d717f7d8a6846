# carry [".whlB", ".devsite", ".benchcfg"], after ../../2026-12-06-h200-seventh/calls/a.sh
# (restores the PTX folder) and b.sh: v.sh and w.sh of the seventh session's plan in one
# call (this session's device time was mostly spent on refused starts): install, Q30,
# (1) the overlap probe on host-placed slots (the pages' way back beside the compute,
# `return_overlap_share`; the CPU's refill of pages on the host against left on the GPU,
# `cpu_write_gb_s`): the price of staging long chunks by migration; (2) batches against
# BatchGenerator, every expert held, B = 1, 2, 4, 8, with BatchGenerator over the engine's
# layers (--bg-streamed) and the host time per step (--host-split). The pad guard's share
# of the gap (SSDMOE_QMM_PAD=off) is w.sh's, a call of its own. X_END (565): the second
# the batches stop by (less where the device time left is short), VS_S (150) their rounds.
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
timeout 110 python3 scripts/cuda_overlap_probe.py --placement host > /root/res/overlap2.jsonl 2>&1
echo "probe exit $? +$(( $(date +%s)-T0 ))s"; tail -2 /root/res/overlap2.jsonl
STEPS=vs INVARIANCE=0 VS_S=${VS_S:-150} VS_ARGS="--bg-streamed --host-split" DEADLINE_S=$(( ${X_END:-565} - ($(date +%s)-T0) )) \
  bash scripts/gpu_batch.sh /root/res/vs > /root/res/vs.log 2>&1
echo "vs exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/vs/steps.log 2>/dev/null; tail -16 /root/res/vs/vs.txt 2>/dev/null
cd /root/res && tar czf $OUT/x.tgz build.log overlap2.jsonl vs vs.log 2>/dev/null
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx

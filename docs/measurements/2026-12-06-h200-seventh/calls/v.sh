# carry [".whlB", ".devsite", ".benchcfg"], after a.sh and b.sh: install, build Q30, then
# batches against mlx-lm's BatchGenerator, every expert held (64G: managed slots), B = 1,
# 2, 4, 8, rounds alternating (issue 43 item 2: >= 1.0x at B = 2, 4, 8), with
# BatchGenerator over the engine's own layers beside them (--bg-streamed) and each side's
# host time per step (--host-split): the gap placed in the loop or in the layer
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
STEPS=vs INVARIANCE=0 VS_ARGS="--bg-streamed --host-split" DEADLINE_S=$(( 565 - ($(date +%s)-T0) )) \
  bash scripts/gpu_batch.sh /root/res/vs > /root/res/vs.log 2>&1
echo "vs exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/vs/steps.log 2>/dev/null; tail -16 /root/res/vs/vs.txt 2>/dev/null
cd /root/res && tar czf $OUT/v.tgz build.log vs vs.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx

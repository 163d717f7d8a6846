# after n1.sh on the same machine (no carry): batches against mlx-lm's BatchGenerator, every
# expert held (64G: managed slots), B = 1, 2, 4, 8, rounds alternating (issue 43 item 2:
# >= 1.0x at B = 2, 4, 8); a call of its own: on 2026-12-05 the step spent 294 s compiling
# and loading before its first row. Then, if the modelcold step of n1.sh was cut, its rest.
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=vs INVARIANCE=0 VS_ARGS="--bg-streamed --host-split" DEADLINE_S=540 bash scripts/gpu_batch.sh /root/res/vs > /root/res/vs.log 2>&1
echo "vs exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/vs/steps.log 2>/dev/null; tail -12 /root/res/vs/vs.txt 2>/dev/null
cd /root/res && tar czf $OUT/n2.tgz vs vs.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx

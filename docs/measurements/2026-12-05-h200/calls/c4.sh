# batches: engine vs BatchGenerator with every expert held (compile inside the step's first round)
T0=$(date +%s); source gpucalls/env.sh
STEPS=vs DEADLINE_S=${C4_S:-540} bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -20 /root/res/gb/steps.log; tail -30 /root/res/gb/vs.txt
tar czf $OUT/c4.tgz -C /root/res gb gb.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); ls -la $OUT

# batches: engine vs BatchGenerator with every expert held, then the real trace at B = 4 (join probe)
T0=$(date +%s); source gpucalls/env.sh
STEPS=vs,trace DEADLINE_S=$(( ${C5_S:-560} )) bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -20 /root/res/gb/steps.log
tar czf $OUT/c5.tgz -C /root/res gb gb.log

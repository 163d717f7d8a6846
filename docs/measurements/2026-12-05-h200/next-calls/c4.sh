# batches: vs BatchGenerator (every expert held) then the real trace at B = 4 with the join probe
T0=$(date +%s); source docs/measurements/2026-12-05-h200/next-calls/env.sh
INVARIANCE=0 VS_S=150 VS_ROUNDS=8 STEPS=vs,trace DEADLINE_S=570 bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/gb/steps.log; grep -v "flips at" /root/res/gb/vs.txt | tail -9; tail -12 /root/res/gb/trace.txt
tar czf $OUT/c4.tgz -C /root/res gb gb.log
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz )

# the real Qwen3-30B trace at B = 1 and 4, 4 GiB, 12 GiB cap, with the 1k-token join probe
# (issue 43 item 2; never run to its end: the H100's call gave it 65 s)
T0=$(date +%s); source scripts/gpu_env.sh
for i in $(seq 1 60); do pgrep -f "batch_bench" >/dev/null || break; sleep 5; done
cat /root/res/build/steps.log | tail -2; du -sh /root/q30
STEPS=trace DEADLINE_S=$(( 575 - ($(date +%s)-T0) )) bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "batch exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/gb/steps.log; tail -14 /root/res/gb/trace.txt
tar czf $OUT/d.tgz -C /root/res gb gb.log build

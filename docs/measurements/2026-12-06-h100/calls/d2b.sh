# the same trace step under the 12 GiB host-memory cap, kernels compiled by d2a (issue 43
# item 2's figures: gb/batch-trace.json aggregate_vs_b1 >= 2.5, mib_per_token_vs_b1 <= 0.7,
# join_probe.max_join_stall_s <= 0.3)
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=trace WARMUP=0 DEADLINE_S=570 bash scripts/gpu_batch.sh /root/res/gb > /root/res/gb.log 2>&1
echo "trace (12 GiB cap) exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/gb/steps.log; tail -6 /root/res/gb/trace.txt
cd /root/res && tar czf $OUT/d2b.tgz gb gb.log

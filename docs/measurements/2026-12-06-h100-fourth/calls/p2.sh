# carry [".benchcfg"], after p1.sh on the same machine: the 16k-token prompt (issue 43:
# "a 16k-token prompt measured"), warm then cold, 4G cache, chunk 4096, resident in the call
T0=$(date +%s); source scripts/gpu_env.sh
PREFILL_TOKENS=16384 PREFILL_MODES="warm cold" STEPS=prefill DEADLINE_S=380 bash scripts/gpu_pipeline.sh /root/res/p2 > /root/res/p2.log 2>&1
echo "p2 exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/p2/steps.log; tail -n 4 /root/res/p2/prefill-*.txt
cd /root/res && tar czf $OUT/p2.tgz p2 p2.log

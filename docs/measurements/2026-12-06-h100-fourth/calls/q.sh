# carry [".benchcfg"], after p1.sh on the same machine: the uniform Qwen3.5 shape, 4G,
# K = 8 / 4 / 2, cold, 12 GiB cap, pipelined (issue 43: >= 90 / 90 / 85 % of the ceiling),
# and its greedy tokens against resident mlx-lm
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=q35,sweep,exact35 DEADLINE_S=420 bash scripts/gpu_pipeline.sh /root/res/q > /root/res/q.log 2>&1
echo "q exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/q/steps.log
cd /root/res && tar czf $OUT/q.tgz q q.log

# after t1.sh on the same machine (no carry): host, managed and device placement side by
# side, read-ahead off / on alternating (timeline-model/-managed/-device .json/.txt)
T0=$(date +%s); source scripts/gpu_env.sh
OUT=/root/res/tl DEADLINE_S=560 STEPS=model,managed,device bash scripts/gpu_timeline.sh > /root/res/t2.log 2>&1
echo "timeline exit $? +$(( $(date +%s)-T0 ))s"; tail -20 /root/res/t2.log
cd /root/res && tar czf $OUT/t2.tgz tl t2.log

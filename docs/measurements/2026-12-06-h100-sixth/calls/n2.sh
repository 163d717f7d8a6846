# after n1.sh on the same machine (no carry): the model's own routing, K = 8, cold under the
# 12 GiB cap, decode read-ahead off / on, host slots against `device` (the mirror auto
# picks): the real trace cold preferred host, the model's routing from the page cache
# preferred `device`; this is the case a user with a model larger than RAM runs
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=modelcold DEADLINE_S=560 bash scripts/gpu_pipeline.sh /root/res/mc > /root/res/mc.log 2>&1
echo "modelcold exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/mc/summary.txt
cd /root/res && tar czf $OUT/n2.tgz mc mc.log

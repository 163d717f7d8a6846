# As run at c5493b2 (its mirror copy probe and the `devmlx` way were removed in ec85f09).
# after n1.sh on the same machine (no carry), if its probe passed: the mirror's direct row
# copies against MLX's in decode, the model's own routing, Q30, 4 GiB, K = 8, the page
# cache warm, read-ahead off / on alternating (the fifth session's `device` 7.81 tok/s,
# host 6.21): timeline-device (direct) and timeline-device-mlx, then host beside them
T0=$(date +%s); source scripts/gpu_env.sh
SSDMOE_SLOT_MIRROR_COPY=direct OUT=/root/res/tl ROUNDS=2 DECODE=24 DEADLINE_S=${N3_S:-330} \
  STEPS=device,devmlx bash scripts/gpu_timeline.sh > /root/res/n3.log 2>&1
echo "timeline exit $? +$(( $(date +%s)-T0 ))s"; tail -12 /root/res/n3.log
cd /root/res && tar czf $OUT/n3.tgz tl n3.log

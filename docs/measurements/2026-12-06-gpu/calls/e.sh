# exact verify priced with the experts split (the CUDA default since 3d1d64e): the demo,
# then the Q30 shape if time is left
T0=$(date +%s); source scripts/gpu_env.sh
STEPS=exact EXACT_ROUNDS=3 DEADLINE_S=${E_S:-300} bash scripts/gpu_spec.sh /root/res/ex > /root/res/ex.log 2>&1
echo "exact exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/ex/steps.log; grep -h verdict /root/res/ex/exact-*.json; grep -h "ratio" /root/res/ex/exact-*.txt | tail -12
tar czf $OUT/e.tgz -C /root/res ex ex.log

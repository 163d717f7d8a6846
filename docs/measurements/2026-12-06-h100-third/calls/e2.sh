# carry [".whlB", ".devsite"] on a fresh machine after a.sh and b.sh of
# docs/measurements/2026-12-06-gpu/calls: install, the demo's compile pass, then exact
# verify priced with the experts split (issue 43 item 3: exact-*.json verdict and ratios)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
echo "install +$(( $(date +%s)-T0 ))s"
STEPS=demo_compile,exact EXACT_ROUNDS=3 DEADLINE_S=${E_S:-480} bash scripts/gpu_spec.sh /root/res/ex > /root/res/ex.log 2>&1
echo "exact exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/ex/steps.log; grep -h verdict /root/res/ex/exact-*.json; grep -h "ratio" /root/res/ex/exact-*.txt | tail -12
tar czf $OUT/e2.tgz -C /root/res ex ex.log

# after ../../2026-12-07-h100-ninth/calls/y.sh on the same machine (installed, /root/q30
# built): the warm prompt with host slots, staged in place (`auto`, before d407a0f) against
# its pages moved ahead in every chunk (`migrate`), alternating. Ran four times on
# 2026-12-07 (tenth session): 4k `migrate host` x 3 (res2, pw2.tgz), 16k `migrate host
# migrate` (res3, p16.tgz), 16k `host migrate` x 2 (res4, p16b.tgz), 8k `migrate host`
# (res5, p8.tgz), each as one call of this shape (TOKENS, WAYS, R, END as given there).
source scripts/gpu_env.sh; T0=$(date +%s); R=${R:-/root/res2}; mkdir -p $R
for way in ${WAYS:-migrate host migrate host migrate}; do
  left=$(( ${END:-330} - ($(date +%s)-T0) )); [ "$left" -gt 70 ] || break
  stage=auto; [ $way = migrate ] && stage=migrate
  n=$(ls $R | grep -c "^p-$way-[0-9]*$"); d=$R/p-$way-$n
  SSDMOE_SLOT_PLACEMENT=host SSDMOE_PREFILL_STAGE=$stage PREFILL_TOKENS=${TOKENS:-4096} \
    PREFILL_MODES=warm STEPS=prefill DEADLINE_S=$(( left - 5 )) bash scripts/gpu_pipeline.sh $d > $d.log 2>&1
  echo "$way exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm" $d/summary.txt
  grep -ho '"pages_move[a-z_]*": [0-9a-z]*' $d/prefill-warm*.json | tr '\n' ' '; echo
done
cd $R && tar czf $OUT/pw.tgz p-*; ls $OUT

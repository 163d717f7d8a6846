# carry [".devsite", ".benchcfg"], after ../../2026-12-07-h100-ninth/calls/a.sh (.whlA),
# ../../2026-12-06-h200-seventh/calls/b.sh (.whlC) and stash.sh (.whlB), each right after
# the last. Install, Q30, then the long prompt's pages moved ahead, chunk by chunk (each
# JSON's `prefill_chunks_s`: [tokens, seconds] per chunk, new in d407a0f): 16k tokens
# (four chunks of 4,096) with the pages moved in every chunk (`migrate`; the first
# process of the 16k shapes: its compile pass), staged in place (`on`), and `auto` (since
# d407a0f: moved in the first chunk only), then 4k `auto` and `on`, then 16k `auto` and
# `on` again as time allows. Read:
# does the first chunk gain (~0.35 s) and each later one lose (~0.4 s) under `migrate`,
# as the totals of 2026-12-07 suggest, and does `auto` reach >= 0.8x at both lengths?
# Z_END (560): the second it stops by.
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
for run in 16384:migrate 16384:on 16384:auto 4096:auto 4096:on 16384:auto 16384:on; do
  tok=${run%%:*}; way=${run##*:}; d=/root/res/z-$tok-$way-$(date +%s)
  left=$(( ${Z_END:-560} - ($(date +%s)-T0) )); [ "$left" -gt 90 ] || break
  SSDMOE_SLOT_PLACEMENT=host SSDMOE_PREFILL_STAGE=$way PREFILL_TOKENS=$tok PREFILL_MODES=warm \
    STEPS=prefill DEADLINE_S=$(( left - 5 )) bash scripts/gpu_pipeline.sh $d > $d.log 2>&1
  echo "$tok $way exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm" $d/summary.txt
  python3 -c "import json,glob;c=json.load(open(glob.glob('$d/prefill-warm*.json')[0]))['configs'][0];print(c['ratio_prefill_vs_resident'],c['tokens_common_prefix'],c['pages_moved_layers'],c['prefill_chunks_s'])"
done
cd /root/res && tar czf $OUT/z1.tgz build.log z-*; ls $OUT

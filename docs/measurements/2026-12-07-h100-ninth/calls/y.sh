# carry [".whlB", ".devsite", ".benchcfg", ".pyspy"], after a.sh (this folder) and
# ../../2026-12-06-h200-seventh/calls/b.sh: install, Q30, then the batch gap placed. The
# ninth session found the engine's B = 8 step 8-10 ms longer than BatchGenerator's outside
# its build, queue and sync (2 ms at B = 4, 0.3 at B = 1, 2); `--host-split` now splits
# that into `deliver` (the tokens handed out after the sync, `to_host`: reading them) and
# `other` (the loop). B = 4, 8 with BatchGenerator over the engine's model beside, then the
# warm 4k prompt on host slots staged in place and with their pages moved ahead
# (`migrate`), alternating, twice. Y_END (560): the second it stops by (~8.5 min in all).
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
timeout 300 python3 scripts/batch_vs_mlx.py --out /root/res/split --model /root/q30 --tag split \
  --expert-cache 64G --batch 4,8 --rounds 8 --deadline-s 150 --decode-tokens 48 \
  --prompt-tokens 64 --host-split --bg-streamed > /root/res/split.txt 2>&1
echo "split exit $? +$(( $(date +%s)-T0 ))s"; tail -12 /root/res/split.txt
# the same B = 8 step under py-spy with native frames (.pyspy/py-spy: the py-spy 0.4.2
# wheel's binary): which line of the loop, and which native call, the rest is spent in
timeout 150 .pyspy/py-spy record --native --rate 500 --idle --format raw -o /root/res/spy-b8.txt -- \
  python3 scripts/batch_vs_mlx.py --out /root/res/spy --model /root/q30 --tag spy \
  --expert-cache 64G --batch 8 --rounds 2 --deadline-s 40 --decode-tokens 48 \
  --prompt-tokens 64 --host-split > /root/res/spy-b8.out 2>&1
echo "spy exit $? +$(( $(date +%s)-T0 ))s"; tail -3 /root/res/spy-b8.out
python3 scripts/batch_spy_summary.py /root/res/spy-b8.txt --top 12
# the warm 4k prompt, host slots staged in place against their pages moved ahead
# (SSDMOE_PREFILL_STAGE=migrate, page_ahead.py), alternating; read `pages_moved_*` and
# `pages_move_failed` in each prefill-warm.json beside the ratio and the tokens
for i in 1 2; do
  for way in host migrate; do
    left=$(( ${Y_END:-560} - ($(date +%s)-T0) )); [ "$left" -gt 100 ] || break 2  # the step skips under 60 s left
    stage=auto; [ $way = migrate ] && stage=migrate
    SSDMOE_SLOT_PLACEMENT=host SSDMOE_PREFILL_STAGE=$stage PREFILL_MODES=warm STEPS=prefill \
      DEADLINE_S=$(( left - 5 )) bash scripts/gpu_pipeline.sh /root/res/pw-$way-$i > /root/res/pw-$way-$i.log 2>&1
    echo "pw $way $i exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm" /root/res/pw-$way-$i/summary.txt
    grep -ho '"pages_move[a-z_]*": [0-9a-z]*' /root/res/pw-$way-$i/prefill-warm.json
  done
done
cd /root/res && tar czf $OUT/y.tgz build.log split split.txt spy spy-b8.* pw-* 2>/dev/null; ls $OUT

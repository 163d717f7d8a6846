# right after z3.sh (installed, /root/q30 built): the warm 4k prompt, host slots, K = 8,
# `on` (staged in place) and `auto` alternating, four each, each printing the ratio, the
# prefill and reading seconds, the layers moved, `prefill_chunks_s` and
# `prefill_chunks_detail` (per chunk: reading s, router sync s, [minor, major] page faults
# of the process; new since this session). Why (eleventh session, z1): `auto` moved the
# 4,095-token chunk's pages (3.38 against 3.78 s in place) but the one-token step after
# it took 0.632 against 0.164 s, total 4.02 against 3.95 s (0.78 against 0.79x), while the
# tenth session's four `migrate` processes (the same code path for a one-chunk prompt:
# the one-token step moves nothing under either, streamed.py's LONG_CHUNK_ROWS) gave
# 3.58-3.69 s (0.84-0.86x). Is the step's cost steady, and is it CPU page faults (its
# reads land in slots whose pages went to the GPU and back)? ~9 min (`END=S` in front: stop
# starting runs S - 70 seconds in).
T0=$(date +%s); source scripts/gpu_env.sh
for run in on auto on auto on auto on auto; do
  d=/root/res/w-$run-$(date +%s)
  left=$(( ${END:-560} - ($(date +%s)-T0) )); [ "$left" -gt 70 ] || break
  SSDMOE_SLOT_PLACEMENT=host SSDMOE_PREFILL_STAGE=$run PREFILL_TOKENS=4096 PREFILL_MODES=warm \
    STEPS=prefill DEADLINE_S=$(( left - 5 )) bash scripts/gpu_pipeline.sh $d > $d.log 2>&1
  echo "$run exit $? +$(( $(date +%s)-T0 ))s"
  python3 -c "import json,glob;c=json.load(open(glob.glob('$d/prefill-warm*.json')[0]))['configs'][0];print(c['ratio_prefill_vs_resident'],c['prefill_s'],c['prefill_read_s'],c['tokens_common_prefix'],c['pages_moved_layers'],c['prefill_chunks_s'],c.get('prefill_chunks_detail'))"
done
cd /root/res && tar czf $OUT/z4.tgz w-*; ls $OUT

# carry [".whlB", ".devsite", ".benchcfg"], after a.sh and b.sh of ../../2026-12-06-gpu/calls:
# install, build Q30, then the 4k warm prefill's compile passes for the ways a long chunk
# can run (issue 43: warm 4k >= 0.8x resident): host slots staged in place (`host`), the
# device mirror that `auto` picks for a 4 GiB cache since the fifth session (`device`),
# host slots staged a layer ahead on a second stream (`ahead`: SSDMOE_PREFILL_STAGE=ahead,
# prestage.py) and the mirror with its long chunks staged ahead from the host banks
# (`devahead`: its copies into the mirror deferred to decode). Each one's first warm 4k
# prefill compiles its shapes (`devahead` shares `ahead`'s and `device`'s: compiled last).
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
STEPS=q30 DEADLINE_S=120 bash scripts/gpu_pipeline.sh /root/res/build > /root/res/build.log 2>&1
echo "q30 exit $? +$(( $(date +%s)-T0 ))s"
n=3
for way in host device ahead; do
  place=$way; stage=auto; [ $way = ahead ] && { place=host; stage=ahead; }
  SSDMOE_SLOT_PLACEMENT=$place SSDMOE_PREFILL_STAGE=$stage PREFILL_MODES=warm STEPS=prefill \
    DEADLINE_S=$(( (570 - ($(date +%s)-T0)) / n )) bash scripts/gpu_pipeline.sh /root/res/pc-$way > /root/res/pc-$way.log 2>&1
  echo "compile $way exit $? +$(( $(date +%s)-T0 ))s"; grep -h "prefill-warm K" /root/res/pc-$way/summary.txt
  n=$(( n - 1 ))
done
cd /root/res && tar czf $OUT/p3a.tgz build.log pc-*
( cd /root && tar cf - ptx | gzip -1 > $OUT/ptx.tgz ); du -sh /root/ptx

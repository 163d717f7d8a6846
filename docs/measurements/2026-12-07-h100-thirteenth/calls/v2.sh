# carry [".devsite", ".benchcfg"], on the machine ../../2026-12-07-h100-twelfth/calls/v1.sh
# installed (/root/q30 built): the batch every expert held at B = 2, 4, 8 again with more
# rounds (the first run's rounds ranged 0.65-1.07x at B = 2, 0.99-1.35x at B = 4, 0.89-1.44x
# at B = 8: the medians need more of them). ~5 min.
T0=$(date +%s)
bash scripts/gpu_install.sh > /root/inst2.log 2>&1 || exit 1
source scripts/gpu_env.sh
o=/root/res/v2; timeout $(( ${END:-320} - ($(date +%s)-T0) )) python3 scripts/batch_vs_mlx.py --out $o \
  --model /root/q30 --tag v2 --expert-cache 64G --batch ${BS:-2,4,8} --rounds ${ROUNDS:-12} \
  --deadline-s ${DL:-200} --decode-tokens 48 --prompt-tokens 64 --host-split --bg-detok > $o.txt 2>&1
echo "v2 exit $? +$(( $(date +%s)-T0 ))s"; tail -9 $o.txt
cd /root/res && tar czf $OUT/v2.tgz v2*; ls $OUT

# carry [".devsite", ".benchcfg"], after v2.sh on the same machine: the qmm guard's price
# in the batch, processes alternating SSDMOE_QMM_PAD=off / auto (the guard's two copies a
# MoE layer), B = 4, 8, every expert held; ~6 min at END=370.
T0=$(date +%s)
source scripts/gpu_env.sh
for i in 1 2 3 4; do
  left=$(( ${END:-370} - ($(date +%s)-T0) )); [ $left -lt 60 ] && break
  m=off; [ $((i % 2)) -eq 0 ] && m=auto
  o=/root/res/v3-$i-$m; SSDMOE_QMM_PAD=$m timeout $(( left < 95 ? left : 95 )) python3 scripts/batch_vs_mlx.py \
    --out $o --model /root/q30 --tag $m --expert-cache 64G --batch 4,8 --rounds 4 --deadline-s 35 \
    --decode-tokens 48 --prompt-tokens 64 --host-split --bg-detok > $o.txt 2>&1
  echo "v3 $i $m exit $? +$(( $(date +%s)-T0 ))s"; grep -E "^\| (4|8) \|" $o.txt
done
cd /root/res && tar czf $OUT/v3.tgz v3*; ls $OUT

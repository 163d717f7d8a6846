# after x.sh on the same machine (no carry: the wheels, Q30 and the PTX folder are there):
# the batch gap's pad guard priced: every expert held against BatchGenerator at B = 4, 8
# with SSDMOE_QMM_PAD off and `auto` (on, under MLX-CUDA), one process each, order
# off / auto / off (drift: compare neighbours)
T0=$(date +%s)
source scripts/gpu_env.sh
i=0
for pad in off auto off; do
  i=$((i+1))
  left=$(( 570 - ($(date +%s)-T0) )); [ "$left" -gt 130 ] || { echo "pad $pad skipped: deadline"; continue; }
  SSDMOE_QMM_PAD=$pad timeout $(( left - 10 )) python3 scripts/batch_vs_mlx.py --out /root/res/pad-$i-$pad \
    --model /root/q30 --tag pad-$pad --expert-cache 64G --batch 4,8 --rounds 6 --deadline-s 90 \
    --decode-tokens 48 --prompt-tokens 64 --host-split > /root/res/pad-$i-$pad.txt 2>&1
  echo "pad $pad exit $? +$(( $(date +%s)-T0 ))s"; tail -8 /root/res/pad-$i-$pad.txt
done
cd /root/res && tar czf $OUT/w.tgz pad-* 2>/dev/null; ls $OUT

# right after z1.sh (installed, /root/q30 built from .benchcfg whose qwen3-tokenizer now
# has a tokenizer.json: mlx-lm's BPE streaming detokenizer, as a real Qwen3 checkpoint
# gets; the tenth session's Q30 had none, so the naive one, which decodes each row's
# text since its last newline every step). Batches, every expert held, against
# BatchGenerator at B = 4, 8 with the step split (`deliver` and `to_host` per step; the
# JSON's `detokenizer` names the classes and transformers' version), first the tokens'
# read alone (scripts/cuda_tolist_probe.py), then with the tokens read as they are and
# copied on the CPU stream (SSDMOE_BATCH_HOST_COPY=on: does `to_host` go, and the gap
# with it?), then the B = 8 step under py-spy: Python frames only, 100 Hz, not pausing
# the process (the tenth session's --native at 500 Hz fell 36 s behind and timed out).
# ~8.5 min.
T0=$(date +%s); source scripts/gpu_env.sh
# the read alone, no model: B tokens read while a ~20 ms stand-in for the next step runs,
# as the sampler leaves them (`direct`) and copied on the CPU stream (`cpu_copy`)
timeout 90 python3 scripts/cuda_tolist_probe.py --rounds 30 --json /root/res/tolist.json \
  > /root/res/tolist.txt 2>&1; echo "tolist exit $? +$(( $(date +%s)-T0 ))s"; tail -7 /root/res/tolist.txt
# the step split, the tokens read as they are, then copied on the CPU stream
for copy in off on; do
  SSDMOE_BATCH_HOST_COPY=$copy timeout 200 python3 scripts/batch_vs_mlx.py --out /root/res/split-$copy \
    --model /root/q30 --tag split --expert-cache 64G --batch 4,8 --rounds 5 --deadline-s 100 \
    --decode-tokens 48 --prompt-tokens 64 --host-split > /root/res/split-$copy.txt 2>&1
  echo "split $copy exit $? +$(( $(date +%s)-T0 ))s"; tail -9 /root/res/split-$copy.txt
done
grep -o '"detokenizer": {[^}]*}' /root/res/split-off/batch_vs_mlx-split.json
# B = 8 with BatchGenerator's rows detokenized every step too (--bg-detok), as
# mlx_lm.server's loop does: the two loops doing a server's work (each of the last two
# steps only with the time it needs left of the call's 600 s)
[ $(( $(date +%s)-T0 )) -lt 400 ] && timeout 150 python3 scripts/batch_vs_mlx.py --out /root/res/split-bgdetok --model /root/q30 \
  --tag split --expert-cache 64G --batch 8 --rounds 4 --deadline-s 70 --decode-tokens 48 \
  --prompt-tokens 64 --host-split --bg-detok > /root/res/split-bgdetok.txt 2>&1
echo "split bg-detok exit $? +$(( $(date +%s)-T0 ))s"; tail -5 /root/res/split-bgdetok.txt
[ $(( $(date +%s)-T0 )) -lt 420 ] && timeout 150 .pyspy/py-spy record --rate 100 --nonblocking --idle --format raw -o /root/res/spy-b8.txt -- \
  python3 scripts/batch_vs_mlx.py --out /root/res/spy --model /root/q30 --tag spy \
  --expert-cache 64G --batch 8 --rounds 2 --deadline-s 60 --decode-tokens 48 \
  --prompt-tokens 64 --host-split > /root/res/spy-b8.out 2>&1
echo "spy exit $? +$(( $(date +%s)-T0 ))s"; tail -3 /root/res/spy-b8.out
python3 scripts/batch_spy_summary.py /root/res/spy-b8.txt --top 12
cd /root/res && tar czf $OUT/z2.tgz tolist.* split-* spy spy-b8.* 2>/dev/null; ls $OUT

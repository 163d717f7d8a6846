# carry [".whlB", ".devsite"], after a.sh and b.sh of docs/measurements/2026-12-06-gpu/calls:
# install; the demo's chat rows (none, ngram, auto; nothing drafted: >= 0.97x plain) in
# two processes, 24 rounds each in the Williams order, after the spec loop's d = 0 rounds
# were made cheaper (the pricing folded, the n-gram keys kept)
T0=$(date +%s)
bash scripts/gpu_install.sh || exit 1
source scripts/gpu_env.sh
echo "install +$(( $(date +%s)-T0 ))s"
for i in $(seq 1 ${G_PROCS:-2}); do
  STEPS=demo DEMO_ROWS=chat DEMO_ROUNDS=${G_ROUNDS:-24} DEMO_COMPILE_S=$([ $i = 1 ] && echo 110 || echo 10) \
    DEADLINE_S=$([ $i = 1 ] && echo 330 || echo 200) bash scripts/gpu_spec.sh /root/res/chat$i > /root/res/chat$i.log 2>&1
  echo "chat $i exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/chat$i/demo-summary.txt
done
cd /root/res && tar czf $OUT/g.tgz chat*

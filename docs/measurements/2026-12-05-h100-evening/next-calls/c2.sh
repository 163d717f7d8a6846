# carry [".whlB", ".devsite"]: install; Q30 build in the background (cores 12-15); on cores
# 0-11: the demo's chat rows twice, in two processes (nothing drafted: >= 0.97x; the
# evening's two processes read 1.10x and 0.95x), then exact verify priced with the experts
# split (the CUDA default since 3d1d64e)
T0=$(date +%s)
W=/root/stash/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /root/stash/part.aa .whlB/part.ab /root/stash/part.ac > $W && rm -f /root/stash/part.a? \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stash/*.whl && touch /tmp/site/.ok
fi
rm -rf /root/devsite; cp -r .devsite /root/devsite
source docs/measurements/2026-12-05-h100-evening/next-calls/env.sh
echo "install +$(( $(date +%s)-T0 ))s"
rm -rf /root/tree && mkdir -p /root/tree && cp -r scripts ssdmoe_tui tests pyproject.toml docs /root/tree/
( cd /root/tree && export R=/root/tree PYTHONPATH=/tmp/site:/root/devsite:/root/tree STEPS=q30 DEADLINE_S=1200 \
  && mkdir -p /root/res/build && setsid nohup taskset -c 12-15 nice -n 10 bash scripts/gpu_batch.sh /root/res/build > /root/res/build.log 2>&1 < /dev/null & )
for i in 1 2; do
  STEPS=demo DEMO_ROWS=chat DEMO_ROUNDS=10 DEMO_COMPILE_S=$([ $i = 1 ] && echo 100 || echo 10) \
    DEADLINE_S=150 taskset -c 0-11 bash scripts/gpu_spec.sh /root/res/chat$i > /root/res/chat$i.log 2>&1
  echo "chat $i exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/chat$i/demo-summary.txt
done
STEPS=exact EXACT_ROUNDS=3 DEADLINE_S=$(( 570 - ($(date +%s)-T0) )) taskset -c 0-11 bash scripts/gpu_spec.sh /root/res/ex > /root/res/ex.log 2>&1
echo "exact exit $? +$(( $(date +%s)-T0 ))s"; grep -h verdict /root/res/ex/exact-*.json; grep -h "ratio" /root/res/ex/exact-demo.txt | tail -8
tar czf $OUT/c2.tgz -C /root/res chat1 chat2 ex ex.log

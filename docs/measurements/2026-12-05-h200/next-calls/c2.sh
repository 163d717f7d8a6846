# carry [".whlB", ".devsite"]: install; Q30 build in the background (cores 12-15); the qmm guard
# under compute-sanitizer, then the demo's speculation rows (cores 0-11)
T0=$(date +%s)
W=/root/stash/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /root/stash/part.aa .whlB/part.ab /root/stash/part.ac > $W && rm -f /root/stash/part.a? \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stash/*.whl && touch /tmp/site/.ok
fi
rm -rf /root/devsite; cp -r .devsite /root/devsite
source docs/measurements/2026-12-05-h200/next-calls/env.sh
echo "install +$(( $(date +%s)-T0 ))s"
rm -rf /root/tree && mkdir -p /root/tree && cp -r scripts ssdmoe_tui tests pyproject.toml /root/tree/ && mkdir -p /root/tree/docs/measurements/2026-12-05-h200 && cp -r docs/measurements/2026-12-05-h200/next-calls /root/tree/docs/measurements/2026-12-05-h200/next-calls
( cd /root/tree && source docs/measurements/2026-12-05-h200/next-calls/env.sh && export R=/root/tree PYTHONPATH=/tmp/site:/root/devsite:/root/tree STEPS=q30 DEADLINE_S=1200 \
  && mkdir -p /root/res/build && setsid nohup taskset -c 12-15 nice -n 10 bash scripts/gpu_batch.sh /root/res/build > /root/res/build.log 2>&1 < /dev/null & )
OUT=/root/res/qg DEADLINE_S=$(( 570 - ($(date +%s)-T0) )) taskset -c 0-11 bash scripts/gpu_qmm_guard.sh > /root/res/qg.log 2>&1
echo "qg exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/qg/steps.log
for f in /root/res/qg/spec/demo-*.txt; do echo "== $f"; tail -6 $f; done
tar czf $OUT/c2.tgz -C /root/res qg qg.log

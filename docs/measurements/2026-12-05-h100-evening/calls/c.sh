# carry [".whlB", ".devsite"]: install; the demo's speculative bench under compute-sanitizer with
# both guards (x: qmm_guard.py; the weights' spare slot: engine/experts/slack.py), then the
# demo's chat rows (none, ngram, auto; 10 ABBA rounds) and the oracle rows
T0=$(date +%s)
W=/root/stash/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /root/stash/part.aa .whlB/part.ab /root/stash/part.ac > $W && rm -f /root/stash/part.a? \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stash/*.whl && touch /tmp/site/.ok
fi
rm -rf /root/devsite; cp -r .devsite /root/devsite
source docs/measurements/2026-12-05-h100-evening/calls/env.sh
echo "install +$(( $(date +%s)-T0 ))s"
OUT=/root/res/qg STEPS=sanitize,spec SANITIZE_MODES=on DEMO_ROWS="chat oracle" DEMO_ROUNDS=10 DEMO_COMPILE_S=${DEMO_COMPILE_S:-100} \
  DEADLINE_S=$(( ${CALL_S:-400} - ($(date +%s)-T0) )) bash scripts/gpu_qmm_guard.sh > /root/res/qg.log 2>&1
echo "qg exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/qg/steps.log; grep -c "Invalid __global__" /root/res/qg/sanitize-on.txt
for f in /root/res/qg/spec/demo-*.txt; do echo "== $f"; tail -6 $f; done
tar czf $OUT/c.tgz -C /root/res qg qg.log

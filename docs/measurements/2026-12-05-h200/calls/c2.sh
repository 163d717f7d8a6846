# install; the Q30 build in the background (cores 12-15, from a copy of the tree); the demo's
# speculation compile pass then its timed rounds (cores 0-11)
T0=$(date +%s)
W=/root/stash/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /root/stash/part.aa .whlB/part.ab /root/stash/part.ac > $W && sha256sum $W | cut -c1-16 && rm -f /root/stash/part.a? \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stash/*.whl && touch /tmp/site/.ok
fi
rm -rf /root/devsite; cp -r .devsite /root/devsite
source gpucalls/env.sh
python3 -c "import mlx.core as mx, mlx_lm, platformdirs; print(mx.__version__, mx.default_device(), mlx_lm.__version__)"
echo "install +$(( $(date +%s)-T0 ))s"
rm -rf /root/tree && mkdir -p /root/tree && cp -r scripts ssdmoe_tui tests pyproject.toml gpucalls /root/tree/
( cd /root/tree && source gpucalls/env.sh && export R=/root/tree PYTHONPATH=/tmp/site:/root/devsite:/root/tree STEPS=q30 DEADLINE_S=1200 \
  && mkdir -p /root/res/build && setsid nohup taskset -c 12-15 nice -n 10 bash scripts/gpu_batch.sh /root/res/build > /root/res/build.log 2>&1 < /dev/null & )
STEPS=demo DEMO_COMPILE_S=${DEMO_COMPILE_S:-240} DEMO_ROUNDS=6 DEADLINE_S=$(( 570 - ($(date +%s)-T0) )) taskset -c 0-11 bash scripts/gpu_spec.sh /root/res/spec > /root/res/spec.log 2>&1
echo "spec exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/spec/steps.log
cat /root/res/spec/demo-summary.txt 2>/dev/null
for f in /root/res/spec/demo-*.txt; do echo "== $f"; tail -8 $f; done
cat /root/res/build/steps.log 2>/dev/null; du -sh /root/q30 /root/ptx 2>/dev/null
tar czf $OUT/c2.tgz -C /root/res spec spec.log

# install, then kernel cache (demo) and spec (demo)
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
OUT=/root/res/kc DEADLINE_S=${KC_S:-330} STEPS=demo bash scripts/gpu_kernel_cache.sh > /root/res/kc.log 2>&1
echo "kc exit $? +$(( $(date +%s)-T0 ))s"; cat /root/res/kc/kernels.jsonl
STEPS=demo DEMO_ROUNDS=6 DEADLINE_S=$(( 565 - ($(date +%s)-T0) )) bash scripts/gpu_spec.sh /root/res/spec > /root/res/spec.log 2>&1
echo "spec exit $? +$(( $(date +%s)-T0 ))s"; tail -5 /root/res/spec/steps.log
for f in /root/res/spec/demo-*.txt; do echo "== $f"; tail -12 $f; done
tar czf $OUT/c2.tgz -C /root/res kc spec kc.log spec.log

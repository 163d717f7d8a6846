#!/usr/bin/env bash
# On a lent GPU machine: join the mlx-cuda-13 wheel's three parts (part.aa and part.ac
# stashed in /root/stash by earlier calls, part.ab carried in .whlB) and install the
# wheels into /tmp/site, once a machine; copy the carried `.devsite` (platformdirs, which
# the image lacks) to /root/devsite. How the parts are made: docs/benchmarks.md and the
# README of a session's calls folder (docs/measurements/*/calls/README.md).
set -euo pipefail
W=/root/stash/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /root/stash/part.aa .whlB/part.ab /root/stash/part.ac > "$W"
  rm -f /root/stash/part.a?
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stash/*.whl
  touch /tmp/site/.ok
fi
rm -rf /root/devsite && cp -r .devsite /root/devsite

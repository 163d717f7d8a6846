# carry [".whlA"]: stash wheel part A and restore the MLX-CUDA PTX folder the seventh
# session of 2026-12-06 brought back (MLX 0.32.4, sm_90: H100 and H200; the Q30 shape's
# K = 8 decode, the 4k prefill and the mirror's copies, 21 MiB), so those compile passes
# take seconds
mkdir -p /root/stash /root && cp .whlA/* /root/stash/ && tar xzf docs/measurements/2026-12-06-h200-seventh/ptx.tgz -C /root && du -sh /root/ptx && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader && nproc

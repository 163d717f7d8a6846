# carry [".whlA"]: stash wheel part A and restore the MLX-CUDA PTX folder the sixth session
# of 2026-12-06 brought back (MLX 0.32.4, sm_90: H100 and H200; the Q30 shape's K = 8
# decode and 4k prefill kernels, 16 MiB), so those compile passes take seconds
mkdir -p /root/stash /root && cp .whlA/* /root/stash/ && tar xzf docs/measurements/2026-12-06-h100-sixth/ptx.tgz -C /root && du -sh /root/ptx && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader && nproc

# carry [".whlA"]: stash wheel part A and restore the MLX-CUDA PTX folder the ninth session
# of 2026-12-07 brought back (MLX 0.32.4, sm_90: H100 and H200; the seventh session's Q30
# decode, 4k prefill and mirror copies plus this session's batch shapes, B = 1-8, 22 MiB),
# so those compile passes take seconds
mkdir -p /root/stash /root && cp .whlA/* /root/stash/ && tar xzf docs/measurements/2026-12-07-h100-ninth/ptx.tgz -C /root && du -sh /root/ptx && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader && nproc

# sourced by a GPU call: the environment every step uses (R: the tree to run from; PTX
# kernels kept in /root/ptx, which MLX-CUDA honours through MLX_PTX_CACHE_DIR)
R=${R:-$PWD}
export PYTHONPATH=/tmp/site:/root/devsite:$R PYTHONUNBUFFERED=1 SSDMOE_HOME=/root/ssdmoe-home SSDMOE_LOCK_DIR=/root/locks
mkdir -p /root/locks /root/res
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p /root/ptx

# sourced: the environment every call uses (R: the tree to run from)
R=${R:-$PWD}
export PYTHONPATH=/tmp/site:/root/devsite:$R PYTHONUNBUFFERED=1 SSDMOE_HOME=/root/ssdmoe-home SSDMOE_LOCK_DIR=/root/locks
mkdir -p /root/locks /root/res
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p /root/ptx

# carry [".whlA"]: stash wheel part A (no kernel folder this time: the compile passes pay)
mkdir -p /root/stash && cp .whlA/* /root/stash/ && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader && nproc && free -g | head -2

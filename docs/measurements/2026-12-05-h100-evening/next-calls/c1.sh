# carry [".whlA", ".gpuptx"]: stash wheel part A; restore the PTX folder the last call saved
mkdir -p /root/stash /root/ptx && cp .whlA/* /root/stash/ && tar xzf .gpuptx/ptx.tgz -C /root && du -sh /root/ptx && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

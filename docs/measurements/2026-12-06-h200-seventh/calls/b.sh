# carry [".whlC"]
cp .whlC/* /root/stash/ && ls /root/stash

"""Experts on disk and in memory: the byte-offset index, the native pread reader, the
slot cache in <2 GiB banks, device placement of slots, disk I/O counters, repack."""

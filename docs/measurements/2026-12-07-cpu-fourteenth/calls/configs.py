"""One line per configuration of a `ssdmoe bench --json` file, what split.sh prints
after each process: K, cache, pipelined, tok/s, share of the disk's ceiling."""

import json
import sys

try:
    result = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  no json: {e}")
for c in result.get("configs", []):
    print(
        "   K",
        c.get("k"),
        c.get("expert_cache"),
        "pipelined" if c.get("pipeline") else "serial",
        "tok/s",
        c.get("decode_tok_s"),
        "x ceiling",
        c.get("achieved_over_ceiling"),
        "disk B/s",
        c.get("disk_bytes_per_s"),
    )

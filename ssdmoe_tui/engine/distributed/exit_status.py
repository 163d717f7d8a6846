"""Each rank's exit status, for `ssdmoe launch` (mlx.launch 0.32 exits 0 whatever the
ranks did, so a script cannot tell a failed launch from a good one by its status).

`ssdmoe launch` makes a private folder and names it in `SSDMOE_DIST_STATUS` for every
rank (through mlx.launch's `--env`). Every rank writes `rank-N.json` there as it ends,
however it ends (a clean return, an error, a verdict of the side channel, SIGTERM from
the launcher): `{"rank": N, "status": S, "peers": {...}}`. Rank 0 also writes what the
side channel told it of each other rank (a clean end, an error, vanished), so a rank on
another machine (whose own file is on that machine's disk) or one killed before it could
write still has a status. `launch_status` turns the files into one status.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV_STATUS = "SSDMOE_DIST_STATUS"
STOPPED = 128 + 15  # SIGTERM: the launcher stopped this rank because another failed
UNKNOWN = 1  # a rank no one could account for (killed before it wrote, never reported)


def status_dir() -> Path | None:
    """The folder `ssdmoe launch` named, when it exists on this machine."""
    text = os.environ.get(ENV_STATUS)
    if not text:
        return None
    d = Path(text)
    return d if d.is_dir() else None  # a rank on another machine: rank 0 speaks for it


def write(rank: int, status: int, peers: dict[int, int] | None = None) -> None:
    """Record this rank's status (once per process: the first verdict stands)."""
    global _written
    d = status_dir()
    if d is None or _written:
        return
    _written = True
    data = {
        "rank": rank,
        "status": int(status),
        "peers": {str(k): v for k, v in (peers or {}).items()},
    }
    tmp = d / f".rank-{rank}.json.p{os.getpid()}.tmp"
    try:  # os._exit follows: keep it short, and never let it fail the exit
        tmp.write_text(json.dumps(data))
        os.replace(tmp, d / f"rank-{rank}.json")
    except OSError:
        pass


_written = False


@dataclass(frozen=True)
class LaunchStatus:
    status: int
    per_rank: dict[int, int | None]  # None: no status from the rank nor from rank 0

    def missing(self) -> list[int]:
        return [r for r, s in self.per_rank.items() if s is None]


def launch_status(d: Path, ranks: int) -> LaunchStatus:
    """One status for the launch: 0 when every rank ended cleanly; else the status of the
    first rank that failed by itself (a rank stopped by the launcher because another
    failed counts only when nothing else did)."""
    own: dict[int, int] = {}
    told: dict[int, int] = {}
    for f in d.glob("rank-*.json"):
        try:
            data = json.loads(f.read_text())
            own[int(data["rank"])] = int(data["status"])
            if int(data["rank"]) == 0:
                told = {int(k): int(v) for k, v in data.get("peers", {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    per_rank: dict[int, int | None] = {
        r: own.get(r, told.get(r)) for r in range(max(ranks, len(own), 1))
    }
    codes = [UNKNOWN if s is None else s for s in per_rank.values()]
    failed = [c for c in codes if c]
    causes = [c for c in failed if c != STOPPED]
    status = causes[0] if causes else failed[0] if failed else 0
    return LaunchStatus(status, per_rank)

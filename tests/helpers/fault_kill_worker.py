"""Kill -9 trials for tests/faults/test_fault_kill.py, run as a script (a fork server).

    python tests/helpers/fault_kill_worker.py TRIALS SEED OUT.json     (SSDMOE_HOME set by the caller)

The modules are imported once; each trial forks a writer that does what the app does
after a reply (add the user turn, add the reply, save a KV checkpoint of the whole
history), round after round, on one of a few conversations; it reports every write that
returned (a committed one) through a pipe. The server SIGKILLs it at a random moment,
then records the committed state. No MLX operation runs before the fork, so each child
starts MLX afresh. Turn texts and token ids are a function of (conversation, index), so
the checker can tell a stored turn from a torn or stale one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

FP = "fingerprint-kill-test"
CONVERSATIONS = 4


def turn_text(conv_id: str, i: int) -> str:
    return f"{conv_id} turn {i} " + "lorem ipsum " * ((i * 37) % 900)


def turn_tokens(i: int) -> list[int]:
    return [(i * 101 + j) % 50_000 for j in range(8 + (i * 7) % 40)]


def _writer(conv_id: str, out: int, seed: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from ssdmoe_tui.sessions.checkpoints import save_checkpoint
    from ssdmoe_tui.sessions.store import SessionStore, Turn

    store = SessionStore()
    conv = store.get(conv_id)
    # What this writer loaded is on disk already: committed, even if the previous writer
    # was killed before reporting its last turn (else two unreported turns could pile up).
    os.write(out, f"T {conv_id} {len(conv.turns)}\n".encode())
    mx.random.seed(seed)
    while True:
        for role in ("user", "assistant"):
            i = len(conv.turns)
            store.add_turn(conv, Turn(role, turn_text(conv_id, i), turn_tokens(i)))
            os.write(out, f"T {conv_id} {len(conv.turns)}\n".encode())
        history = conv.history_tokens()
        cache = KVCache()
        kv = mx.random.normal((1, 2, len(history), 32))
        cache.update_and_fetch(kv, kv)
        save_checkpoint(store.folder(conv_id), [cache], history, FP)
        os.write(out, f"K {conv_id} {len(history)}\n".encode())


def main() -> int:
    trials, seed, out_path = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    import mlx.core  # noqa: F401 - imported before the forks (no MLX operation runs here)
    import mlx_lm.models.cache  # noqa: F401 - slow to import (transformers): once

    import ssdmoe_tui.sessions.checkpoints  # noqa: F401
    from ssdmoe_tui.sessions.store import SessionStore

    store = SessionStore()
    ids = [store.create("kill-test", FP).id for _ in range(CONVERSATIONS)]
    rng = random.Random(seed)
    committed = {i: {"turns": 0, "kv_tokens": 0} for i in ids}
    killed_after = []
    t0 = time.monotonic()
    for trial in range(trials):
        conv_id = ids[trial % len(ids)]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(r)
            try:
                _writer(conv_id, w, seed + trial)
            finally:
                os._exit(0)
        os.close(w)
        delay = rng.uniform(0.03, 0.3)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(r, "rb") as f:
            lines = f.read().decode().splitlines()
        for line in lines:
            kind, cid, n = line.split()
            key = "turns" if kind == "T" else "kv_tokens"
            committed[cid][key] = max(committed[cid][key], int(n))
        killed_after.append({"delay_s": round(delay, 3), "writes": len(lines)})
    out_path.write_text(
        json.dumps(
            {
                "trials": trials,
                "seconds": round(time.monotonic() - t0, 1),
                "committed": committed,
                "kills": killed_after,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

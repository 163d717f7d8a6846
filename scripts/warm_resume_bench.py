"""Warm resume, measured: the first reply's decode tok/s after a restart, with and
without reading the saved expert working set back first.

    python scripts/warm_resume_bench.py save  MODEL HOME CACHE   # the conversation to resume
    python scripts/warm_resume_bench.py cold  MODEL HOME CACHE   # a restart, no warm-up
    python scripts/warm_resume_bench.py warm  MODEL HOME CACHE   # a restart with warm resume
    python scripts/warm_resume_bench.py warm-now MODEL HOME CACHE  # the prompt right behind it

`save` runs one reply in a fresh conversation under SSDMOE_HOME=HOME (its KV checkpoint
and experts.json are written), `cold` / `warm` resume it in a fresh process and print
one JSON line with the second reply's figures (and, for `warm`, the warm-up's). Run each
restart from a copy of HOME (the reply writes a new checkpoint), in a memory cgroup
with the page cache dropped: scripts/warm_resume_bench.sh does all of that.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import time

FIRST = " ".join(["Explain how a mixture of experts model routes each token to a few experts."] * 4)
SECOND = "Go on: what happens to the experts that are not chosen?"
TOKENS = int(os.environ.get("TOKENS", "24"))


def main(mode: str, model: str, home: str, cache: str) -> None:
    os.environ["SSDMOE_HOME"] = home
    from ssdmoe_tui.engine.run import protocol as P
    from ssdmoe_tui.engine.run.service import EngineService
    from ssdmoe_tui.options import SamplingOptions
    from ssdmoe_tui.prompting.message import Message
    from ssdmoe_tui.sessions.app_sessions import AppSessions
    from ssdmoe_tui.sessions.kv_hooks import session_hooks
    from ssdmoe_tui.sessions.store import SessionStore

    events: queue.Queue = queue.Queue()
    svc = EngineService(events.put, kv_hooks=session_hooks)
    svc.start()

    def wait(kind, timeout: float = 1800.0):
        deadline = time.monotonic() + timeout
        while True:
            ev = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(ev, P.EngineError):
                raise SystemExit(f"engine error: {ev.message}")
            if isinstance(ev, kind):
                return ev

    t0 = time.perf_counter()
    svc.submit(P.LoadModel(path=model, expert_cache=cache))
    loaded = wait(P.ModelLoaded)
    info, tok = loaded.info, loaded.tokenizer
    load_s = time.perf_counter() - t0
    sessions = AppSessions(SessionStore())
    if mode == "save":
        conv_id = sessions.open(None)[0]
        chat = [Message("user", FIRST)]
    else:
        conv_id, turns = sessions.open("")
        chat = [Message(t.role, t.content) for t in turns] + [Message("user", SECOND)]
    out: dict = {"mode": mode, "cache": cache, "load_s": round(load_s, 2)}
    prompt = sessions.prompt(conv_id, chat, tok, info)
    reply = P.Generate(
        "r",
        prompt_tokens=tuple(prompt),
        sampling=SamplingOptions(max_tokens=TOKENS),
        session_id=conv_id,
    )  # sent behind the warm-up (`warm-now`) or once it is done (the other modes)
    if mode.startswith("warm"):
        got = sessions.working_set(conv_id, info)
        if got.warning or not got.working_set:
            raise SystemExit(f"no working set to warm: {got.warning}")
        svc.submit(P.WarmExperts(got.working_set))
    if mode == "warm-now":  # the prompt stops the warm-up after its reader call in flight
        svc.submit(reply)
    if mode.startswith("warm"):
        w = wait(P.ExpertsWarmed)
        out["warm"] = {
            "requested": w.requested,
            "read": w.read,
            "no_room": w.no_room,
            "mib": round(w.bytes_read / 2**20, 1),
            "seconds": round(w.seconds, 2),
            "cancelled": w.cancelled,
        }
    if mode != "warm-now":
        svc.submit(reply)
    done = wait(P.GenerationDone)
    while svc.busy:
        time.sleep(0.05)
    if mode == "save":
        chat.append(Message("assistant", done.text))
        sessions.record(conv_id, chat, done, info.name)
    st = done.stats
    out.update(
        {
            "tokens": len(done.token_ids),
            "decode_tok_s": st.get("decode_tok_s"),
            "prefill_tok_s": st.get("prefill_tok_s"),
            "prompt_tokens": st.get("prompt_tokens"),
            "reused_tokens": st.get("reused_prompt_tokens"),
            "hits": st.get("expert_cache_hits"),
            "misses": st.get("expert_cache_misses"),
            "kv_hit_rate": st.get("kv_hit_rate"),
            "expert_hit_rate": st.get("expert_cache_hit_rate"),
            "decode_hits": st.get("decode_expert_cache_hits"),
            "decode_misses": st.get("decode_expert_cache_misses"),
            "ssd_mib_per_token": st.get("ssd_mib_per_token"),
            "budget_mib": round(info.expert_cache_budget / 2**20),
            "token_ids": list(done.token_ids),
        }
    )
    svc.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""Run under `mlx.launch` by tests/test_distributed.py: greedy tokens of several
checkpoints on an expert-parallel engine, printed by rank 0 as one JSON object.

usage: python -m tests.distributed_worker PROMPT_IDS N_TOKENS EXPERT_CACHE MODEL...
       python -m tests.distributed_worker --service PROMPT_IDS N_TOKENS EXPERT_CACHE MODEL
(--service: rank 0 drives an `EngineService` the way the server does, the others follow)
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from mlx_lm.sample_utils import make_sampler

    from ssdmoe_tui.engine.distributed import start
    from ssdmoe_tui.engine.loader import load_streamed
    from ssdmoe_tui.engine.runner import Runner

    prompt = [int(x) for x in argv[0].split(",")]
    n, budget, models = int(argv[1]), argv[2], argv[3:]
    dist = start()
    out = {}
    with dist.guard():
        for path in models:
            sm = load_streamed(path, expert_cache=budget, distributed=dist)
            try:
                sm.tokenizer.eos_token_ids = set()  # exactly n tokens
                res = Runner(sm).generate(
                    prompt, max_tokens=n, sampler=dist.wrap_sampler(make_sampler(0.0))
                )
                out[path] = res.tokens
            finally:
                sm.close()
    if dist.is_root:
        print(json.dumps(out), flush=True)
    return 0


def service_main(argv: list[str]) -> int:
    """Two requests at K=2 and K=4 (set between them, as the server does per request),
    a third cancelled while decoding, a fourth after it, and a next turn of the first
    conversation (KV reused): rank 0 prints what it got."""
    import queue
    import threading

    from ssdmoe_tui.engine import protocol as P
    from ssdmoe_tui.engine.distributed import ServiceLink, follow, start
    from ssdmoe_tui.engine.options import EngineOptions
    from ssdmoe_tui.engine.service import EngineService

    prompt = tuple(int(x) for x in argv[0].split(","))
    n, budget, model = int(argv[1]), argv[2], argv[3]
    dist = start()
    with dist.guard():
        if not dist.is_root:
            return follow(dist, EngineOptions())
        events: queue.Queue = queue.Queue()
        service = EngineService(events.put)
        ServiceLink(dist).attach(service)
        service.start()

        def wait(kind, request_id=None, on=None):
            while True:
                ev = events.get(timeout=60)
                if on is not None:
                    on(ev)
                if isinstance(ev, P.EngineError):
                    raise RuntimeError(ev.message)
                if isinstance(ev, kind) and getattr(ev, "request_id", request_id) == request_id:
                    return ev

        service.submit(P.LoadModel(path=model, expert_cache=budget))
        wait(P.ModelLoaded)
        out = {}
        for rid, k in (("a", 2), ("b", 4)):
            service.set_k(k)
            service.submit(P.Generate(rid, prompt_tokens=prompt, max_tokens=n, session_id=rid))
            done = wait(P.GenerationDone, rid)
            out[rid] = {"tokens": list(done.token_ids), "stats": done.stats}
        seen = threading.Event()

        def cancel_on_tokens(ev) -> None:
            if isinstance(ev, P.Tokens) and ev.request_id == "c" and not seen.is_set():
                seen.set()
                service.cancel()

        service.submit(P.Generate("c", prompt_tokens=prompt, max_tokens=10_000, session_id="c"))
        done = wait(P.GenerationDone, "c", on=cancel_on_tokens)
        out["c"] = {"tokens": list(done.token_ids), "finish": done.finish_reason}
        service.submit(P.Generate("d", prompt_tokens=prompt, max_tokens=n, session_id="d"))
        out["d"] = {"tokens": list(wait(P.GenerationDone, "d").token_ids)}
        # the next turn of session "a": its KV is reused from memory on every rank alike
        turn = prompt + tuple(out["a"]["tokens"]) + (5, 6)
        service.submit(P.Generate("e", prompt_tokens=turn, max_tokens=n, session_id="a"))
        done = wait(P.GenerationDone, "e")
        out["e"] = {"tokens": list(done.token_ids), "stats": done.stats}
        service.shutdown(timeout=60)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--service"]:
        sys.exit(service_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))

"""Run under `mlx.launch` by tests/engine/test_distributed.py (one launch, two parts):

1. greedy tokens of several checkpoints on the bare expert-parallel engine (Runner);
2. an `EngineService` on every rank, rank 0 driving it the way the server does (K set
   per request, a cancel while decoding, a next turn that reuses the KV cache), the
   other ranks following.

Rank 0 prints one JSON object: {"engine": {model: tokens}, "service": {request: ...}}.

usage: python -m tests.helpers.distributed_worker PROMPT_IDS N_TOKENS EXPERT_CACHE SERVICE_MODEL MODEL...
"""

from __future__ import annotations

import json
import queue
import sys
import threading


def bare_engine(dist, models: list[str], prompt: list[int], n: int, budget: str) -> dict:
    from mlx_lm.sample_utils import make_sampler

    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    out = {}
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
    return out


def drive_service(dist, model: str, prompt: tuple[int, ...], n: int, budget: str) -> dict:
    """rank 0: requests at K=2 and K=4 (set between them, as the server does), one
    cancelled while decoding, one after it, and the next turn of the first conversation."""
    from ssdmoe_tui.engine.distributed.link import ServiceLink
    from ssdmoe_tui.engine.run import protocol as P
    from ssdmoe_tui.engine.run.service import EngineService
    from ssdmoe_tui.options import SamplingOptions

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

    def run(rid: str, tokens: tuple[int, ...], max_tokens: int, session: str, on=None):
        service.submit(P.Generate(rid, prompt_tokens=tokens, sampling=SamplingOptions(max_tokens=max_tokens), session_id=session))  # fmt: skip
        return wait(P.GenerationDone, rid, on)

    service.submit(P.LoadModel(path=model, expert_cache=budget))
    wait(P.ModelLoaded)
    out = {}
    for rid, k in (("a", 2), ("b", 4)):
        service.set_k(k)
        done = run(rid, prompt, n, rid)
        out[rid] = {"tokens": list(done.token_ids), "stats": done.stats}
    seen = threading.Event()

    def cancel_on_tokens(ev) -> None:
        if isinstance(ev, P.Tokens) and ev.request_id == "c" and not seen.is_set():
            seen.set()
            service.cancel()

    done = run("c", prompt, 10_000, "c", cancel_on_tokens)
    out["c"] = {"tokens": list(done.token_ids), "finish": done.finish_reason}
    out["d"] = {"tokens": list(run("d", prompt, n, "d").token_ids)}
    # the next turn of conversation "a": its KV is reused from memory on every rank alike
    done = run("e", prompt + tuple(out["a"]["tokens"]) + (5, 6), n, "a")
    out["e"] = {"tokens": list(done.token_ids), "stats": done.stats}
    service.shutdown(timeout=60)
    return out


def main(argv: list[str]) -> int:
    from ssdmoe_tui.engine.distributed.group import start
    from ssdmoe_tui.engine.distributed.link import follow
    from ssdmoe_tui.options import EngineOptions

    prompt = [int(x) for x in argv[0].split(",")]
    n, budget, service_model, models = int(argv[1]), argv[2], argv[3], argv[4:]
    dist = start()
    with dist.guard():
        engine = bare_engine(dist, models, prompt, n, budget)
        if not dist.is_root:
            return follow(dist, EngineOptions())
        service = drive_service(dist, service_model, tuple(prompt), n, budget)
        print(json.dumps({"engine": engine, "service": service}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

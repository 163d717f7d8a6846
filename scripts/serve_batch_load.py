"""Concurrent chat requests to `ssdmoe serve` (issue 20): N at once against one alone.

Starts `ssdmoe serve` (a subprocess under a throwaway SSDMOE_HOME, `--max-batch`), then per
round: each of N different questions alone (one after another), then all N at once
(threads, the official `openai` client, streaming). Reports, per round, one stream's
decode rate (the mean of the requests alone), the aggregate while N run together (all
their tokens after the first / from the first token of the first stream to the last token
of the last one), their ratio, whether every reply equals its request alone, and the
server's /v1/stats batch figures. The order of the two phases flips each round. Also the
server process's CPU time per generated token in each phase (/proc/PID/stat), the
steadier figure on a loaded machine, where the client threads compete for the same cores
and the wall-clock ratio swings with the other processes' load.

    .venv/bin/python scripts/serve_batch_load.py --model DIR [--n 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ServerProc  # noqa: E402

QUESTIONS = [
    "Why stream experts from a disk instead of holding them in memory?",
    "Write three lines about caches.",
    "What does a router in a mixture of experts decide?",
    "Name five colours and one fruit for each.",
    "How does a page cache help repeated reads?",
    "Explain batching in one paragraph.",
    "What is a token?",
    "List the planets in order.",
]


def stream(client, model: str, question: str, max_tokens: int) -> dict:  # noqa: ANN001
    first = last = None
    text = []
    s = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    usage = None
    for chunk in s:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            text.append(chunk.choices[0].delta.content)
    return {"first": first, "last": last, "n": usage.completion_tokens, "text": "".join(text)}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import openai

    home = tempfile.mkdtemp(prefix="ssdmoe-batch-load-")
    env = dict(os.environ, SSDMOE_HOME=home, SSDMOE_LOCK_DIR=str(Path(home) / "locks"))
    srv = ServerProc(args.model, env, extra=["--max-batch", str(args.n), "--no-disk-cache"])
    client = openai.OpenAI(base_url=srv.base, api_key="unused", max_retries=0, timeout=600)
    qs = QUESTIONS[: args.n]
    rounds = []
    try:
        pid = srv.proc.pid
        for r in range(args.rounds):
            got: list = [None] * len(qs)

            def run(i: int, got: list = got) -> None:
                got[i] = stream(client, srv.model, qs[i], args.max_tokens)

            def together() -> float:
                c0 = cpu_s(pid)
                threads = [threading.Thread(target=run, args=(i,)) for i in range(len(qs))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(600)
                return cpu_s(pid) - c0

            if r % 2:
                cpu_together = together()
            c0 = cpu_s(pid)
            alone = [stream(client, srv.model, q, args.max_tokens) for q in qs]
            cpu_alone = cpu_s(pid) - c0
            if r % 2 == 0:
                cpu_together = together()
            one = statistics.mean((a["n"] - 1) / (a["last"] - a["first"]) for a in alone)
            ms_alone = 1e3 * cpu_alone / sum(a["n"] for a in alone)
            ms_together = 1e3 * cpu_together / sum(g["n"] for g in got)
            span = max(g["last"] for g in got) - min(g["first"] for g in got)
            agg = sum(g["n"] - 1 for g in got) / span
            same = sum(a["text"] == g["text"] for a, g in zip(alone, got, strict=True))
            import httpx

            batch = httpx.get(srv.base + "/stats", timeout=10).json().get("batch")
            rec = {"round": r, "one_stream_tok_s": round(one, 2), "aggregate_tok_s": round(agg, 2),
                   "ratio": round(agg / one, 3), "equal_alone": f"{same}/{len(qs)}",
                   "tokens": [g["n"] for g in got], "span_s": round(span, 3),
                   "server_cpu_ms_per_token_alone": round(ms_alone, 3),
                   "server_cpu_ms_per_token_together": round(ms_together, 3),
                   "server_cpu_ratio": round(ms_alone / ms_together, 3),
                   "first_token_spread_s": round(max(g["first"] for g in got)
                                                 - min(g["first"] for g in got), 3),
                   "batch": batch, "load": os.getloadavg()}  # fmt: skip
            print(json.dumps(rec), flush=True)
            rounds.append(rec)
    finally:
        srv.stop()
    ratios = [x["ratio"] for x in rounds]
    cpu = [x["server_cpu_ratio"] for x in rounds]
    print(f"median aggregate / one stream over {len(ratios)} rounds: {statistics.median(ratios)}"
          f"; server CPU per token alone / together: {statistics.median(cpu)}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rounds, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

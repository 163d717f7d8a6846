"""Load test of `ssdmoe serve` against `ssdmoe generate` on the same model and prompt.

Measures, through HTTP with the official `openai` client (streaming):
- time to first token (TTFT) of a cold ~4,000-token prompt (nothing cached),
- TTFT of the next turn of that conversation (served from the in-memory KV cache),
- TTFT of that same turn after a server restart (served from the KV checkpoint on disk),
- TTFT of a new chat with the same system prompt on the restarted server (the system
  part's own checkpoint),
- decode tok/s as the client sees it (tokens after the first / time since the first) and
  as the engine reports it, against `ssdmoe generate --json` on the same messages.

    .venv/bin/python scripts/serve_load.py --model DIR [--prompt-tokens 4000] [--max-tokens 64]

Prints a table and writes JSON (--out) with the conditions (cores, load average, model,
dtype). The server runs as a subprocess under a throwaway SSDMOE_HOME (its model index
is rebuilt there: nothing of the user's data is touched), on a free loopback port.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "streaming experts from the disk keeps memory small while the router picks a few "
    "experts per token and the cache holds the ones used most often "
).split()


def long_text(tokenizer, n_tokens: int) -> str:
    """Text of about `n_tokens` tokens for this tokenizer (plain words, no specials)."""
    text = ""
    i = 0
    while True:
        chunk = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(64))
        i += 7
        if len(tokenizer.encode(text + " " + chunk)) > n_tokens:
            return text
        text = (text + " " + chunk).strip()


def run_generate(model: str, system: str | None, user: str, max_tokens: int, env: dict) -> dict:
    cmd = [sys.executable, "-m", "ssdmoe_tui.cli", "generate", "--model", model, "--json",
           "--prompt", user, "--max-tokens", str(max_tokens)]  # fmt: skip
    if system:
        cmd += ["--system", system]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    res = json.loads(out.stdout)
    res["wall_s"] = time.perf_counter() - t0
    return res


class ServerProc:
    def __init__(self, model: str, env: dict, extra: list[str] | None = None) -> None:
        cmd = [sys.executable, "-m", "ssdmoe_tui.cli", "serve", "--model", model, "--port", "0"]
        cmd += extra or []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        line = self.proc.stdout.readline()  # "ssdmoe serve: http://127.0.0.1:PORT/v1  model 'X'"
        if "http://" not in line:
            self.proc.kill()
            raise SystemExit(
                f"server did not start: {line.strip()} {self.proc.stderr.read()[-500:]}"
            )
        self.base = line.split()[2]
        self.model = line.split("model", 1)[1].strip().strip("'")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def stream_chat(client, model: str, messages: list, max_tokens: int) -> dict:
    """One streamed request: TTFT (first content token), client-side decode rate, usage."""
    t0 = time.perf_counter()
    first = last = None
    text = []
    usage = ext = None
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        if chunk.model_extra and chunk.model_extra.get("ssdmoe"):
            ext = chunk.model_extra["ssdmoe"]
        piece = chunk.choices[0].delta.content
        if piece:
            now = time.perf_counter()
            first = first or now
            last = now
            text.append(piece)
    n = usage.completion_tokens
    # The server batches tokens (every ~25 ms), so the first chunk may hold a few tokens.
    decode = (n - 1) / (last - first) if last and first and last > first and n > 1 else 0.0
    return {
        "ttft_s": round(first - t0, 3) if first else None,
        "total_s": round(time.perf_counter() - t0, 3),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "completion_tokens": n,
        "client_decode_tok_s": round(decode, 2),
        "server_decode_tok_s": ext["stats"]["decode_tok_s"] if ext else None,
        "server_prefill_tok_s": ext["stats"]["prefill_tok_s"] if ext else None,
        "text": "".join(text),
    }


def stream_raw(base: str, model: str, messages: list, max_tokens: int) -> dict:
    """A streamed request read with httpx, parsing only what is needed: on this 2-core
    machine a client's own CPU use slows the engine, so the decode comparison keeps it small."""
    import httpx

    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    first = last = None
    text, ext, usage = [], None, None
    with httpx.stream("POST", base + "/chat/completions", json=body, timeout=3600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            c = json.loads(line[6:])
            usage = c.get("usage") or usage
            ext = c.get("ssdmoe") or ext
            delta = c["choices"][0]["delta"] if c.get("choices") else {}
            if delta.get("content"):
                last = time.perf_counter()
                first = first or last
                text.append(delta["content"])
    n = usage["completion_tokens"]
    return {
        "client_decode_tok_s": round((n - 1) / (last - first), 2)
        if n > 1 and last > first
        else 0.0,
        "server_decode_tok_s": ext["stats"]["decode_tok_s"],
        "completion_tokens": n,
        "text": "".join(text),
    }


def ttft_runs(args, model: str, env: dict, messages: list, q2: str, rows: dict, connect) -> None:
    """Cold prompt, the next turn from memory, the same turn after a restart from disk."""
    srv = ServerProc(model, env)
    try:
        print("serve: cold prompt ...", file=sys.stderr)
        rows["cold"] = stream_chat(connect(srv), srv.model, messages, args.max_tokens)
        turn2 = messages + [
            {"role": "assistant", "content": rows["cold"]["text"]},
            {"role": "user", "content": q2},
        ]
        print("serve: next turn (memory) ...", file=sys.stderr)
        rows["cached"] = stream_chat(connect(srv), srv.model, turn2, args.max_tokens)
    finally:
        srv.stop()
    srv = ServerProc(model, env)
    try:
        print("serve: next turn after a restart (disk) ...", file=sys.stderr)
        rows["restart"] = stream_chat(connect(srv), srv.model, turn2, args.max_tokens)
        print("serve: new chat, same system prompt ...", file=sys.stderr)
        other = [messages[0], {"role": "user", "content": "A different question, then."}]
        rows["new_chat"] = stream_chat(connect(srv), srv.model, other, args.max_tokens)
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", required=True, help="model folder (a demo or test checkpoint)")
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per TTFT request")
    ap.add_argument("--decode-tokens", type=int, default=128, help="tokens per decode run")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved decode runs")
    ap.add_argument("--decode-only", action="store_true", help="skip the TTFT part")
    ap.add_argument("--out", default="serve_load.json")
    args = ap.parse_args()

    import openai
    from mlx_lm.utils import load_tokenizer

    model = str(Path(args.model).resolve())
    tok = load_tokenizer(Path(model))
    system = long_text(tok, args.prompt_tokens)
    q1, q2 = "Summarize that in one line.", "Now say it differently."
    home = tempfile.mkdtemp(prefix="ssdmoe-serve-load-")
    env = {**os.environ, "SSDMOE_HOME": home, "SSDMOE_LOCK_DIR": str(Path(home) / "locks")}
    conditions = {
        "model": model,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_start": os.getloadavg(),
        "prompt_tokens_target": args.prompt_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }

    def connect(srv: ServerProc):
        return openai.OpenAI(base_url=srv.base, api_key="unused", max_retries=0, timeout=3600)

    messages = [{"role": "system", "content": system}, {"role": "user", "content": q1}]
    rows: dict = {}
    if not args.decode_only:
        ttft_runs(args, model, env, messages, q2, rows, connect)
    decode: dict[str, list] = {"generate": [], "serve_client": [], "serve_engine": [],
                               "serve_warm_engine": []}  # fmt: skip
    short = [{"role": "user", "content": q1}]
    same = False
    # Decode: `generate` (a fresh process: cold expert cache) against the first request of
    # a fresh server (cold too), alternately on a short prompt; the machine is shared, so
    # medians of interleaved runs. A second request on the same server shows the warm rate.
    for i in range(args.repeat):
        print(f"decode round {i + 1}/{args.repeat} ...", file=sys.stderr)
        gen = run_generate(model, None, q1, args.decode_tokens, env)
        decode["generate"].append(gen["stats"]["decode_tok_s"])
        srv = ServerProc(model, env)
        try:
            r = stream_raw(srv.base, srv.model, short, args.decode_tokens)
            decode["serve_client"].append(r["client_decode_tok_s"])
            decode["serve_engine"].append(r["server_decode_tok_s"])
            warm = stream_raw(srv.base, srv.model, short, args.decode_tokens)
            decode["serve_warm_engine"].append(warm["server_decode_tok_s"])
        finally:
            srv.stop()
        if i == 0:
            same = r["text"] == gen["text"] and r["completion_tokens"] == len(gen["token_ids"])
    conditions["load_avg_end"] = os.getloadavg()
    med = {k: statistics.median(v) for k, v in decode.items()}
    report = {
        "conditions": {**conditions, "dtype": gen["stats"].get("dtype"), "k": gen["k"]},
        "ttft": {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in rows.items()},
        "decode_tokens": args.decode_tokens,
        "decode_tok_s_runs": decode,
        "decode_tok_s_median": med,
        "same_greedy_output_as_generate": same,
        "http_client_decode_vs_generate": round(med["serve_client"] / med["generate"], 4),
        "engine_decode_under_http_vs_generate": round(med["serve_engine"] / med["generate"], 4),
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'TTFT':<28}{'prompt':>8}{'cached':>8}{'TTFT s':>9}")
    for name, label in (("cold", "serve, cold"), ("cached", "serve, next turn (memory)"),
                        ("restart", "serve, next turn (disk)"),
                        ("new_chat", "serve, new chat (disk)")):  # fmt: skip
        if name not in rows:
            continue
        r = rows[name]
        print(f"{label:<28}{r['prompt_tokens']:>8}{r['cached_tokens']:>8}{r['ttft_s']:>9.2f}")
    print(f"decode tok/s, median of {args.repeat} ({args.decode_tokens} tokens): generate "
          f"{med['generate']:.2f}, HTTP client {med['serve_client']:.2f} "
          f"({report['http_client_decode_vs_generate']:.3f}x), engine under HTTP "
          f"{med['serve_engine']:.2f}, warm server {med['serve_warm_engine']:.2f}; "
          f"same greedy output: {same}")  # fmt: skip
    print(f"load avg {conditions['load_avg_start']} -> {conditions['load_avg_end']} on "
          f"{conditions['cpu_count']} cores; JSON: {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

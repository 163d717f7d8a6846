"""Where a CPU decode token's CPU goes, by thread: resident mlx-lm against the streamed
engine, alternating in one process (issue 43 item 4's second harness):

    python scripts/cpu_thread_split.py --model DIR --expert-cache 256M --rounds 3

Each decode (same prompt, greedy, the same number of tokens) is bracketed at its first
and last token by a read of every thread's user + system time from
/proc/self/task/*/stat; the difference, per decoded token, is split into the main
thread (Python: graph building, lookups, host-sync waits cost nothing), the native
reader's workers (named `ssdmoe-read`: page-cache copies, widening) and the rest (MLX's
stream threads: the compute). Linux only. Prints one line a round and engine, then the
median CPU-time ratio resident / streamed and whether the tokens matched.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, tuple[str, float]]:
    """tid -> (class, CPU ms so far) of every thread of this process."""
    out: dict[int, tuple[str, float]] = {}
    pid = os.getpid()
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        ms = (int(fields[11]) + int(fields[12])) * TICK_MS  # utime, stime
        kind = "main" if int(tid) == pid else "reader" if comm == "ssdmoe-read" else "other"
        out[int(tid)] = (kind, ms)
    return out


def split(a: dict, b: dict, steps: int) -> dict[str, float]:
    """CPU ms per token by class between snapshots `a` and `b`."""
    per: dict[str, float] = {"main": 0.0, "reader": 0.0, "other": 0.0}
    for tid, (kind, ms) in b.items():
        per[kind] += ms - a.get(tid, (kind, 0.0))[1]
    per = {k: v / steps for k, v in per.items()}
    per["total"] = sum(per.values())
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expert-cache", default="256M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=16)
    args = ap.parse_args()

    import mlx.core as mx
    import mlx_lm

    from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
    from ssdmoe_tui.engine.run.runner import Runner, TokenEvent
    from ssdmoe_tui.engine.run.sampling import greedy

    sm = load_streamed(Path(args.model), expert_cache=args.expert_cache)
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    model, tok = mlx_lm.load(args.model)
    cast_model(model, sm.dtype)
    mx.eval(model.parameters())
    tok.eos_token_ids = set()
    vocab = min(int(sm.config.get("text_config", sm.config)["vocab_size"]), 1024)
    prompt = [(7 + 13 * i) % (vocab - 8) + 4 for i in range(args.prompt_tokens)]
    n = args.decode_tokens

    def bracket(tokens_iter) -> tuple[list[int], dict]:
        tokens, marks = [], []
        for t in tokens_iter:
            tokens.append(t)
            if len(tokens) in (1, n):
                marks.append(thread_cpu())
        return tokens, split(marks[0], marks[-1], n - 1)

    def resident():
        it = mlx_lm.stream_generate(model, tok, mx.array(prompt), max_tokens=n, sampler=greedy())
        return bracket(int(r.token) for r in it)

    def streamed():
        it = runner.stream(prompt, max_tokens=n)
        return bracket(ev.token for ev in it if isinstance(ev, TokenEvent))

    resident()
    streamed()  # warm both (kernels, page cache)
    ratios, same = [], True
    for r in range(args.rounds):
        order = [("resident", resident), ("streamed", streamed)]
        if r % 2:
            order.reverse()
        got = {name: fn() for name, fn in order}
        same = same and got["resident"][0] == got["streamed"][0]
        for name in ("resident", "streamed"):
            p = got[name][1]
            print(
                f"round {r + 1} {name:8s} CPU ms/token: total {p['total']:7.1f} = main "
                f"{p['main']:6.1f} + reader {p['reader']:5.1f} + other {p['other']:7.1f}",
                flush=True,
            )
        ratios.append(got["resident"][1]["total"] / got["streamed"][1]["total"])
    print(
        f"CPU-time ratio resident/streamed: median {statistics.median(ratios):.3f} "
        f"({' '.join(f'{x:.3f}' for x in ratios)}); same tokens: {'yes' if same else 'NO'}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""llama-server on one thread against two: CPU and wall time per token, side by side in one run.

SmolLM2-135M-Instruct on llama.cpp's own server (`.ci/llama-server.sh`, `.ci/smollm2.sh`), the model the
`real` tier runs. Each round starts the server once per thread count, in turns, and has it read a
prompt of about 1,100 tokens (no cache) and write 200 tokens; the server's CPU comes from
/proc/PID/stat. Two threads meet at a barrier on every layer and spin there: on a 135M model's short
layers that is most of their work, and with anything else running on the cores it is nearly all of it.
The load average is printed beside each figure: compare rows taken at like loads.

Run: .venv/bin/python bench/llama_threads_bench.py [--rounds 2] [--tokens 200]   (about a minute a round on a quiet 2-core machine)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from taskweaver_lite.testing.llama_server import LlamaServer, built_server, llama_server, missing, smollm2

README = Path(__file__).resolve().parent.parent / "README.md"
THREADS = (1, 2)


def server_cpu(server: LlamaServer) -> float:
    """Seconds of CPU the server has used (user and system)."""
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_token(server: LlamaServer, body: dict[str, object], counted: str) -> tuple[float, float, int]:
    """CPU and wall milliseconds per token of one `/completion`, and its tokens (`counted`: prompt_n or predicted_n)."""
    cpu, wall = server_cpu(server), time.perf_counter()
    reply = server.post("/completion", body)
    cpu, wall = server_cpu(server) - cpu, time.perf_counter() - wall
    tokens = int(reply["timings"][counted])
    return 1000 * cpu / tokens, 1000 * wall / tokens, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one server per thread count, in turns")
    parser.add_argument("--tokens", type=int, default=200, help="tokens each server writes")
    args = parser.parse_args()
    binary, model = built_server(), smollm2()
    if binary is None or model is None:
        sys.exit(missing())
    prompt = README.read_text(encoding="utf-8")[:4000]
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    print(f"{'round':>5} {'threads':>7} {'phase':<8} {'tokens':>6} {'CPU ms/token':>13} {'wall ms/token':>14} {'load':>5}")
    for number in range(1, args.rounds + 1):
        for threads in THREADS:
            with llama_server(binary, model, context=4096, slots=1, threads=threads, options=("--seed", "7")) as server:
                story = {"prompt": "Write a long story about a cat.", "n_predict": args.tokens, "ignore_eos": True, "cache_prompt": False}
                phases = {"prompt": ({"prompt": prompt, "n_predict": 1, "cache_prompt": False}, "prompt_n"), "generate": (story, "predicted_n")}
                for phase, (body, counted) in phases.items():
                    cpu, wall, tokens = per_token(server, body, counted)
                    results.setdefault((threads, phase), []).append((cpu, wall))
                    print(f"{number:>5} {threads:>7} {phase:<8} {tokens:>6} {cpu:>13.1f} {wall:>14.1f} {os.getloadavg()[0]:>5.1f}", flush=True)
    print("\nmedians; ratio = two threads / one thread")
    for phase in ("prompt", "generate"):
        one, two = ([statistics.median(v[i] for v in results[(t, phase)]) for i in (0, 1)] for t in THREADS)
        cpu_text, wall_text = f"{two[0]:.1f} / {one[0]:.1f} ms = {two[0] / one[0]:.2f}x", f"{two[1]:.1f} / {one[1]:.1f} ms = {two[1] / one[1]:.2f}x"
        print(f"{phase:<8} CPU per token {cpu_text}   wall per token {wall_text}")


if __name__ == "__main__":
    main()

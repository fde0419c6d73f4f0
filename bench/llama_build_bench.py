"""llama-server as .ci/llama-server.sh builds it against another build: tokens a second, side by side in one run.

SmolLM2-135M-Instruct (`.ci/smollm2.sh`), the model the `real` tier runs, on one thread, as the tests run it.
The build under test is the one the tests find (`.ci/llama-server.sh`: ggml's CPU kernels with AVX2, FMA,
F16C and BMI2, at -O3); the baseline is the portable build (`LLAMA_SERVER_BUILD=portable .ci/llama-server.sh`:
no AVX, everything at -O1, what the script built before) or any binary given with `--baseline`. Each round
starts one server per build, in turns, and times three phases (a generating phase's prompt is read by a
request of its own first, so that its CPU is the generation's alone):

- prompt: a prompt of about 1,100 tokens read with no cache (`/completion`, one token written);
- generate: 200 tokens written freely (`ignore_eos`) after that prompt, so that each token attends to
  about 1,300 before it, as a reply in the chat does (its prompts run from 600 to 1,700 tokens);
- grammar: a reply to that prompt held to the CodeGenerator's JSON Schema (`/v1/chat/completions`,
  `response_format` json_schema, as `llm.structured: auto` sends it), up to 200 tokens: the sampler
  checks candidate tokens against the grammar.

Tokens a second come from the server's own timings (wall time: at a load above 2 they say more about the
load than the build), CPU per token from /proc/PID/stat (what to compare). `--chat` also runs the
`real` tier's seeded chat (`tests/test_real_chat.py`: three requests on the bundled sample data) on each
build and prints its wall time and the server's CPU. The load average is printed beside each figure.

Run: .venv/bin/python bench/llama_build_bench.py [--baseline PATH] [--rounds 2] [--chat]   (a minute a round; the chat 1-4 minutes a build)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from taskweaver_lite.llm.replies import CODE_GENERATOR_SCHEMA, json_schema
from taskweaver_lite.testing.llama_server import LlamaServer, built_server, llama_server, missing, portable_server, smollm2

README = Path(__file__).resolve().parent.parent / "README.md"
SEED = "1"  # the real tier's (SMOLLM2_SEED in tests/conftest.py)
PHASES = ("prompt", "generate", "grammar")


def server_cpu(server: LlamaServer) -> float:
    """Seconds of CPU the server has used (user and system)."""
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(server: LlamaServer, path: str, body: dict[str, Any], counted: str) -> tuple[float, float, int]:
    """Tokens a second (the server's timings) and CPU milliseconds per token of one request, and its tokens.

    The prompt is read first, by a request that writes one token and leaves it in the cache, so that a
    generating phase's CPU is its generation's alone.
    """
    if counted == "predicted":
        server.post(path, {**body, "n_predict": 1, "max_tokens": 1, "cache_prompt": True, "response_format": None})
    cpu = server_cpu(server)
    reply = server.post(path, body)
    cpu = server_cpu(server) - cpu
    timings = reply["timings"]
    tokens = int(timings[f"{counted}_n"])
    return float(timings[f"{counted}_per_second"]), 1000 * cpu / tokens, tokens


def phases(server: LlamaServer, tokens: int) -> dict[str, tuple[float, float, int]]:
    """Each phase's tokens a second, CPU ms per token and tokens, on a running server."""
    prompt = README.read_text(encoding="utf-8")[:4000]
    story = {"prompt": prompt + "\n\nWrite a long story about a cat.", "n_predict": tokens, "ignore_eos": True, "cache_prompt": True}
    schema = {"type": "json_schema", "json_schema": {"name": "CodeGenerator", "strict": True, "schema": json_schema(CODE_GENERATOR_SCHEMA)}}
    ask = f"{prompt}\n\nWrite Python that loads sales.csv with pandas and prints the total of its revenue column. Answer in JSON."
    grammar = {"messages": [{"role": "user", "content": ask}], "max_tokens": tokens, "response_format": schema, "cache_prompt": True}
    return {
        "prompt": timed(server, "/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": False}, "prompt"),
        "generate": timed(server, "/completion", story, "predicted"),
        "grammar": timed(server, "/v1/chat/completions", grammar, "predicted"),
    }


def chat(binary: Path, model: Path, options: tuple[str, ...]) -> tuple[float, float, int, int]:
    """The `real` tier's chat on `binary`, seeded as the tier seeds it: wall seconds, server CPU seconds, cells run, cells that succeeded."""
    import real_chat  # from tests/, put on sys.path above
    from test_real_chat import ASKED, SETTINGS

    with llama_server(binary, model, slots=2, threads=1, options=("--seed", SEED, *options)) as server, tempfile.TemporaryDirectory() as scratch:
        cpu, wall = server_cpu(server), time.perf_counter()
        project = real_chat.sample_project(Path(scratch), server, structured="auto", planner_examples=False, settings=SETTINGS)
        outcome = real_chat.run_chat(project, ASKED)
        succeeded = sum(1 for r in outcome.rounds for p in r.posts if p.execution is not None and p.execution.success)
        return time.perf_counter() - wall, server_cpu(server) - cpu, outcome.cells, succeeded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None, help="the build to compare with (default: the portable build's cached binary)")
    parser.add_argument("--build", type=Path, default=None, help="the build under test (default: the one the tests find)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one server per build, in turns")
    parser.add_argument("--tokens", type=int, default=200, help="tokens each generating phase writes at most")
    parser.add_argument("--chat", action="store_true", help="also run the real tier's seeded chat on each build")
    parser.add_argument("--options", default="", help="server options for the build under test (`-fa off`...; default: none, as the tests run it)")
    parser.add_argument("--baseline-options", default="", help="server options for the baseline (default: none)")
    args = parser.parse_args()
    build, baseline, model = args.build or built_server(), args.baseline or portable_server(), smollm2()
    if build is None or model is None:
        sys.exit(missing())
    if baseline is None:
        sys.exit("no baseline: build the portable one with `LLAMA_SERVER_BUILD=portable .ci/llama-server.sh`, or give --baseline PATH")
    builds = {"baseline": baseline, "build": build}
    options = {"baseline": tuple(args.baseline_options.split()), "build": tuple(args.options.split())}
    for name, binary in builds.items():
        print(f"{name}: {binary} {' '.join(options[name])}")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    print(f"\n{'round':>5} {'build':<8} {'phase':<8} {'tokens':>6} {'tokens/s':>9} {'CPU ms/token':>13} {'load':>5}")
    for number in range(1, args.rounds + 1):
        for name, binary in builds.items():
            with llama_server(binary, model, context=4096, slots=1, threads=1, options=("--seed", SEED, *options[name])) as server:
                for phase, (rate, cpu, tokens) in phases(server, args.tokens).items():
                    results.setdefault((name, phase), []).append((rate, cpu))
                    print(f"{number:>5} {name:<8} {phase:<8} {tokens:>6} {rate:>9.1f} {cpu:>13.2f} {os.getloadavg()[0]:>5.1f}", flush=True)
    print("\nmedians; ratio = build / baseline")
    for phase in PHASES:
        old, new = ([statistics.median(v[i] for v in results[(name, phase)]) for i in (0, 1)] for name in builds)
        rate_text, cpu_text = f"{new[0]:.1f} / {old[0]:.1f} = {new[0] / old[0]:.2f}x", f"{new[1]:.2f} / {old[1]:.2f} ms = {new[1] / old[1]:.2f}x"
        print(f"{phase:<8} tokens/s {rate_text}   CPU per token {cpu_text}")
    if args.chat:
        print(f"\nthe real tier's chat (seed {SEED}), one per build")
        figures = {}
        for name, binary in builds.items():
            wall, cpu, cells, succeeded = figures[name] = chat(binary, model, options[name])
            print(f"{name:<8} wall {wall:.1f} s, server CPU {cpu:.1f} s, cells run {cells} ({succeeded} succeeded), load {os.getloadavg()[0]:.1f}", flush=True)
        (old_wall, old_cpu, *_), (new_wall, new_cpu, *_) = figures["baseline"], figures["build"]
        walls, cpus = f"{new_wall:.1f} / {old_wall:.1f} s = {new_wall / old_wall:.2f}x", f"{new_cpu:.1f} / {old_cpu:.1f} s = {new_cpu / old_cpu:.2f}x"
        print(f"chat     wall {walls}   server CPU {cpus}")


if __name__ == "__main__":
    main()

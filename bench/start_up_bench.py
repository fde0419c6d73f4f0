"""How soon each command answers: `taskweaver-lite --help`, `--version`, `sessions`, `config`, `users list`,
and `mcp` up to its `initialize` answer, each against `python -c pass` timed in the same run.

Each figure is the median of `--runs` fresh processes of the installed console script (the same
interpreter), alternating with the baseline so that a noisy machine weighs on both alike. A project is
made in a temporary folder for the commands that read one. `mcp` is timed twice: to its `initialize`
answer (the target), and to its answer to a first `sessions` call, which reads the config and opens
the project (what `initialize` no longer waits for). Its second baseline is the floor the MCP SDK
sets: a bare SDK server (no tools, nothing of ours) started the same way, to its `initialize` answer.
`acp` is timed likewise: to its `initialize` answer, which opens nothing (`acp initialize`), and to
its answer to a first `session/load` of a session that is not there, which reads the config and opens
the project, then answers "no session" (`acp first call`: no kernel starts). That one is what
`initialize` waited for when the command opened the project before answering it.

Beside each wall time, the CPU time (user and system) the command's process spent until it exited
or answered: on a machine busy with other work, the wall times grow with the load and the CPU times
much less, so they tell a change in our start-up from a busier machine.

    python bench/start_up_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SCRIPT = str(Path(sys.executable).with_name("taskweaver-lite"))
TARGETS = {"--help": 0.25, "mcp initialize": 0.6}  # seconds, on a 2-core machine
HELP_RATIO = 20.0  # --help at most this many times `python -c pass`


Timing = tuple[float, float]  # seconds of wall time, seconds of CPU time
TICK = os.sysconf("SC_CLK_TCK")


def run_to_exit(argv: list[str]) -> Timing:
    """Seconds a process takes from start to exit (its output thrown away), and the CPU seconds it spent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_so_far(pid: int) -> float:
    """The CPU seconds (user and system) a running process has spent, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime and stime, the 14th and 15th fields


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
SESSIONS_CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sessions", "arguments": {}}}
ACP_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}


# The MCP SDK's own start: its low-level server on stdio, with nothing of ours.
BARE_SERVER = """
import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

async def main():
    server = Server("bare", version="1")
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())

anyio.run(main)
"""


def mcp_answer(argv: list[str], *, first_call: bool = False) -> Timing:
    """Seconds from starting the MCP server `argv` to its answer to `initialize` on stdout (with `first_call`: to a `sessions` call's after it)."""
    started = time.perf_counter()
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdin is not None and server.stdout is not None
    messages = [INITIALIZE, INITIALIZED, SESSIONS_CALL] if first_call else [INITIALIZE]
    server.stdin.write("".join(json.dumps(message) + "\n" for message in messages))
    server.stdin.flush()
    answers = [server.stdout.readline() for _ in range(2 if first_call else 1)]
    seconds = time.perf_counter() - started
    cpu = cpu_so_far(server.pid)
    server.stdin.close()
    server.wait(timeout=30)
    if not all('"result"' in answer and '"isError":true' not in answer for answer in answers):
        sys.exit(f"mcp did not answer: {answers!r}")
    return seconds, cpu


def acp_answer(argv: list[str], project: Path, *, first_call: bool = False) -> Timing:
    """Seconds from starting `acp` to its `initialize` answer (with `first_call`: to its answer to a `session/load` of no session after it)."""
    started = time.perf_counter()
    agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert agent.stdin is not None and agent.stdout is not None
    load = {"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": {"cwd": str(project), "sessionId": "none-such", "mcpServers": []}}
    messages = [ACP_INITIALIZE, load] if first_call else [ACP_INITIALIZE]
    agent.stdin.write("".join(json.dumps(message) + "\n" for message in messages))
    agent.stdin.flush()
    answers = [agent.stdout.readline() for _ in messages]
    seconds = time.perf_counter() - started
    cpu = cpu_so_far(agent.pid)
    agent.stdin.close()
    agent.wait(timeout=30)
    if '"result"' not in answers[0] or (first_call and "none-such" not in answers[1]):
        sys.exit(f"acp did not answer: {answers!r}")
    return seconds, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="processes of each command, alternating with the baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder) / "project"
        subprocess.run([SCRIPT, "init", str(project)], stdout=subprocess.DEVNULL, check=True)
        os.chdir(folder)
        commands: dict[str, Callable[[], Timing]] = {
            "python -c pass": lambda: run_to_exit([sys.executable, "-c", "pass"]),
            "--help": lambda: run_to_exit([SCRIPT, "--help"]),
            "--version": lambda: run_to_exit([SCRIPT, "--version"]),
            "sessions": lambda: run_to_exit([SCRIPT, "sessions", "-p", str(project)]),
            "config": lambda: run_to_exit([SCRIPT, "config", "-p", str(project)]),
            "users list": lambda: run_to_exit([SCRIPT, "users", "list", "-p", str(project)]),
            "bare SDK server": lambda: mcp_answer([sys.executable, "-c", BARE_SERVER]),
            "mcp initialize": lambda: mcp_answer([SCRIPT, "mcp", "-p", str(project)]),
            "mcp first call": lambda: mcp_answer([SCRIPT, "mcp", "-p", str(project)], first_call=True),
            "acp initialize": lambda: acp_answer([SCRIPT, "acp", "-p", str(project)], project),
            "acp first call": lambda: acp_answer([SCRIPT, "acp", "-p", str(project)], project, first_call=True),
        }
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, measure in commands.items():
                wall, spent = measure()
                seconds[name].append(wall)
                cpu[name].append(spent)
    baseline = statistics.median(seconds["python -c pass"])
    sdk = statistics.median(seconds["bare SDK server"])
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':<16} {'median':>9} {'min':>9} {'max':>9} {'CPU':>9} {'x python -c pass':>17}  target")
    for name, values in seconds.items():
        median = statistics.median(values)
        target = f"< {TARGETS[name]:.2f} s" if name in TARGETS else ""
        met = name not in TARGETS or median < TARGETS[name]
        if name == "--help":
            target += f" and < {HELP_RATIO:.0f}x"
            met = met and median / baseline < HELP_RATIO
        verdict = ("met" if met else "MISSED") if target else ""
        spent = statistics.median(cpu[name]) * 1000
        figures = f"{median * 1000:>7.0f} ms {min(values) * 1000:>6.0f} ms {max(values) * 1000:>6.0f} ms {spent:>6.0f} ms {median / baseline:>16.1f}x"
        print(f"{name:<16} {figures}  {target} {verdict}".rstrip())
    ours = statistics.median(seconds["mcp initialize"])
    ours_cpu, sdk_cpu = statistics.median(cpu["mcp initialize"]), statistics.median(cpu["bare SDK server"])
    print(
        f"mcp initialize / the bare SDK server's: {ours / sdk:.2f}x ({(ours - sdk) * 1000:+.0f} ms); "
        f"CPU {ours_cpu / sdk_cpu:.2f}x ({(ours_cpu - sdk_cpu) * 1000:+.0f} ms)"
    )
    acp_first, acp_init = statistics.median(seconds["acp first call"]), statistics.median(seconds["acp initialize"])
    print(
        f"acp initialize / acp first call (what initialize waited for when the project was opened first): "
        f"{acp_init / acp_first:.2f}x ({(acp_init - acp_first) * 1000:+.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

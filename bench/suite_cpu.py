"""What each test file costs in CPU: every process it starts counted, each file run alone in a cgroup of its own.

CI's run is CPU-bound on two cores, so its wall time follows the CPU its tests spend. This runs each
test file the tiers select (by default those `.ci/run` gives four workers: not unit, llama or real)
as its own `python -m pytest` inside a new cgroup v2 group: kernels, `serve` replicas, the gateway,
PostgreSQL (pg_ctl daemonises it; it stays in the group), Chromium, nginx and node are all counted,
whichever way they detach. The figure is the group's `cpu.stat` (user + system) once every process
in it has exited; a process still there 10 s after pytest exits is listed as left behind, then killed.

While a file runs, the group's processes are looked at ten times a second: each is put in a kind
(kernel, serve, postgres, chromium, ...) by its command line, and its CPU at the last look is added
to that kind. Those are lower bounds (time after the last look, and processes shorter than a look,
fall to "other"), but they say where a file's CPU goes, and how often it starts each fixed cost.

Run it as root (it makes cgroups), serially, under nice, while the machine is otherwise as loaded as
when you compare against it:

    nice -n 10 .venv/bin/python bench/suite_cpu.py --save build/suite_cpu/before.json
    nice -n 10 .venv/bin/python bench/suite_cpu.py --against build/suite_cpu/before.json [tests/test_soak.py ...]

`--against` prints each file's CPU as a ratio to the saved run's, and the totals of the files both
measured. Each file's pytest output is kept in build/suite_cpu/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CI_TIERS = "not unit and not llama and not real"  # the tiers .ci/run gives four workers
TICK = os.sysconf("SC_CLK_TCK")
LOOK_SECONDS = 0.1
LINGER_SECONDS = 10.0  # how long a file's processes may outlive its pytest before they count as left behind

# Kinds of process, first match wins, on the command line joined by spaces.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("initdb", re.compile(r"(^|/)initdb ")),
    ("pg_ctl", re.compile(r"(^|/)pg_ctl ")),
    ("postgres", re.compile(r"(^|/)postgres( |$)|^postgres: ")),
    ("chromedriver", re.compile(r"chromedriver")),
    ("chromium", re.compile(r"(^|/)(chromium|chrome)[^ ]*( |$)|chrome_crashpad")),
    ("nginx", re.compile(r"^nginx|(^|/)nginx ")),
    ("node", re.compile(r"(^|/)node ")),
    ("bwrap", re.compile(r"(^|/)bwrap ")),
    ("kernel", re.compile(r"ipykernel")),
    ("serve", re.compile(r"-m taskweaver_lite serve|bin/taskweaver-lite serve")),
    ("gateway", re.compile(r"-m taskweaver_lite gateway|bin/taskweaver-lite gateway")),
    ("mcp", re.compile(r"-m taskweaver_lite mcp|bin/taskweaver-lite mcp")),
    ("acp", re.compile(r"-m taskweaver_lite acp|bin/taskweaver-lite acp")),
    ("jupyterlab", re.compile(r"jupyter[-_ ]?lab|jupyter-server|jupyter_server")),
    ("phoenix", re.compile(r"-m phoenix|phoenix\.server")),
    ("twl-cli", re.compile(r"-m taskweaver_lite|bin/taskweaver-lite ")),
    ("pytest", re.compile(r"-m pytest|/pytest ")),
    ("python", re.compile(r"python")),
)
# The kinds whose starts are counted.
LAUNCHED = ("initdb", "postgres", "chromium", "nginx", "node", "kernel", "serve", "gateway", "mcp", "acp", "twl-cli", "jupyterlab", "phoenix", "python")


def kind_of(command: str) -> str:
    """The kind of process a command line is ("other" when none matches)."""
    return next((name for name, pattern in KINDS if pattern.search(command)), "other")


@dataclass
class FileCost:
    """One test file's run: CPU seconds (user, system), wall seconds, pytest's summary, CPU and starts by kind."""

    path: str
    cpu: float = 0.0
    user: float = 0.0
    system: float = 0.0
    wall: float = 0.0
    summary: str = ""
    returncode: int = 0
    cpu_by_kind: dict[str, float] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    left_behind: list[str] = field(default_factory=list)


def cgroup2_root() -> Path:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or its `unified` folder on a hybrid host)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if parts[2] == "cgroup2":
            return Path(parts[1])
    sys.exit("no cgroup v2 hierarchy mounted here (mount -t cgroup2 none /sys/fs/cgroup)")


def selected_files(tiers: str, tree: Path) -> list[str]:
    """The test files with at least one test the tier expression selects, in collection order."""
    command = [str(python_of(tree)), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", tiers]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    files = dict.fromkeys(line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line)
    if not files:
        sys.exit(f"nothing collected for -m {tiers!r}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return list(files)


def python_of(tree: Path) -> Path:
    """The interpreter a checkout's tests run on: its own .venv's, else this one."""
    venv = tree / ".venv" / "bin" / "python"
    return venv if tree != REPO and venv.exists() else Path(sys.executable)


def read_stat(pid: str) -> tuple[str, str, float] | None:
    """A process's command line, its parent's id and its CPU seconds so far (None: it has gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if not command:  # a zombie, or a kernel thread: its name
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return command, fields[1], (int(fields[11]) + int(fields[12])) / TICK  # ppid, utime, stime


def run_file(path: str, *, tiers: str, group_root: Path, logs: Path, tree: Path) -> FileCost:
    """Run one test file alone in a fresh cgroup; what it cost."""
    group = group_root / re.sub(r"[^\w.-]", "_", path)
    if group.exists():
        _empty(group)
        group.rmdir()
    group.mkdir()
    procs = group / "cgroup.procs"
    command = [str(python_of(tree)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", tiers, path]
    log_path = logs / (Path(path).stem + ".log")
    cost = FileCost(path)
    seen: dict[str, tuple[str, str, float]] = {}  # pid: the command line last seen (after an exec), parent, CPU
    started = time.perf_counter()
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=lambda: _enter(procs))
        deadline = None
        while True:
            pids = procs.read_text().split()
            for pid in pids:
                found = read_stat(pid)
                if found is not None:  # a zombie's command line is its name: the last real one is kept
                    seen[pid] = (seen[pid][0] if pid in seen and found[0].count(" ") == 0 else found[0], found[1], found[2])
            if process.poll() is not None:
                cost.wall = time.perf_counter() - started
                deadline = deadline or time.perf_counter() + LINGER_SECONDS
                if not pids or time.perf_counter() > deadline:
                    break
            time.sleep(LOOK_SECONDS)
    cost.returncode = process.returncode
    lines = log_path.read_text(errors="replace").strip().splitlines()
    cost.summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", line)), lines[-1] if lines else "")
    left = procs.read_text().split()
    cost.left_behind = [seen.get(pid, (pid, "", 0.0))[0][:160] for pid in left]
    _empty(group)
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    cost.user, cost.system = int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6
    cost.cpu = int(stat["usage_usec"]) / 1e6
    group.rmdir()
    by_kind: defaultdict[str, float] = defaultdict(float)
    starts: Counter[str] = Counter()
    kinds = {pid: kind_of(command_line) for pid, (command_line, _, _) in seen.items()}
    for pid, (_, parent, seconds) in seen.items():
        by_kind[kinds[pid]] += seconds
        # A start: a process of a counted kind whose parent is of another kind (runuser starting initdb, the
        # shell pg_ctl starts the server with, a browser's renderers and a server's backends are not).
        if kinds[pid] in LAUNCHED and kinds.get(parent) != kinds[pid]:
            starts[kinds[pid]] += 1
    by_kind["other"] += max(0.0, cost.cpu - sum(by_kind.values()))
    cost.cpu_by_kind = {kind: round(seconds, 2) for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1]) if seconds >= 0.01}
    cost.starts = dict(starts)
    return cost


def _enter(procs: Path) -> None:
    """In the child, before pytest starts: into the file's group, with Ctrl-C back to its default.

    A shell that starts this script in the background (`&`) has it ignore SIGINT, and an ignored signal
    stays ignored across exec: the Ctrl-C tests' commands would not stop.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    procs.write_text(f"{os.getpid()}\n")


def _empty(group: Path) -> None:
    """Kill whatever is left in a group and wait until it is empty."""
    if not (group / "cgroup.procs").read_text().split():
        return
    (group / "cgroup.kill").write_text("1\n")
    for _ in range(100):
        if not (group / "cgroup.procs").read_text().split():
            return
        time.sleep(0.1)


def print_table(costs: list[FileCost], against: dict[str, FileCost], top: int) -> None:
    """The files by CPU, heaviest first, then the totals and the fixed costs started in more than one file."""
    ranked = sorted(costs, key=lambda cost: -cost.cpu)
    header = f"{'file':42} {'CPU s':>7} {'user':>6} {'sys':>6} {'wall s':>7}"
    header += f" {'before':>7} {'ratio':>6}" if against else ""
    print(header + "  where the CPU went (s)")
    for cost in ranked[:top]:
        row = f"{cost.path:42} {cost.cpu:7.1f} {cost.user:6.1f} {cost.system:6.1f} {cost.wall:7.1f}"
        if against:
            before = against.get(cost.path)
            row += f" {before.cpu:7.1f} {cost.cpu / before.cpu:6.2f}" if before and before.cpu else f" {'-':>7} {'-':>6}"
        kinds = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in list(cost.cpu_by_kind.items())[:4])
        flag = "" if cost.returncode in (0, 5) else f"  [{cost.summary}]"
        print(f"{row}  {kinds}{flag}")
    if len(ranked) > top:
        rest = ranked[top:]
        print(f"{f'... {len(rest)} more files':42} {sum(cost.cpu for cost in rest):7.1f}")
    total_cpu, total_wall = sum(cost.cpu for cost in costs), sum(cost.wall for cost in costs)
    user, system = sum(cost.user for cost in costs), sum(cost.system for cost in costs)
    print(f"{f'total ({len(costs)} files)':42} {total_cpu:7.1f} {user:6.1f} {system:6.1f} {total_wall:7.1f}")
    if against:
        both = [cost for cost in costs if cost.path in against]
        now, then = sum(cost.cpu for cost in both), sum(against[cost.path].cpu for cost in both)
        if then:
            print(f"{'files measured in both runs':42} {now:7.1f} {'':13} {'':7} {then:7.1f} {now / then:6.2f}")
    starts: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    for cost in costs:
        for kind, count in cost.starts.items():
            starts[kind].append((Path(cost.path).stem, count))
    print("\nstarted, across files (kind: starts in files; the files that start it most)")
    for kind, where in sorted(starts.items(), key=lambda item: -sum(count for _, count in item[1])):
        most = ", ".join(f"{name} {count}" for name, count in sorted(where, key=lambda item: -item[1])[:6])
        print(f"  {kind:12} {sum(count for _, count in where):4} in {len(where):3} files: {most}")
    by_kind: Counter[str] = Counter()
    for cost in costs:
        by_kind.update(cost.cpu_by_kind)
    print("\nCPU by kind of process, all files (s): " + ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in by_kind.most_common()))
    failed = [cost for cost in costs if cost.returncode not in (0, 5)]
    for cost in failed:
        print(f"FAILED {cost.path}: {cost.summary}")
    for cost in costs:
        for command in cost.left_behind:
            print(f"LEFT BEHIND by {cost.path}: {command}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files to measure (default: every file the tiers select)")
    parser.add_argument("-m", dest="tiers", default=CI_TIERS, help=f"pytest's tier expression (default: {CI_TIERS!r})")
    parser.add_argument("--save", type=Path, help="write the results here as JSON")
    parser.add_argument("--against", type=Path, help="a saved run to print ratios against")
    parser.add_argument("--top", type=int, default=25, help="rows of the table")
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout to run, on its own .venv (default: this one): a baseline")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: each file runs in a cgroup of its own")
    root = cgroup2_root() / f"suite_cpu.{os.getpid()}"
    root.mkdir()
    tree = args.tree.resolve()
    logs = REPO / "build" / "suite_cpu" / "logs" / tree.name
    logs.mkdir(parents=True, exist_ok=True)
    files = args.files or selected_files(args.tiers, tree)
    costs: list[FileCost] = []
    try:
        for number, path in enumerate(files, 1):
            cost = run_file(path, tiers=args.tiers, group_root=root, logs=logs, tree=tree)
            costs.append(cost)
            print(f"[{number}/{len(files)}] {path:42} {cost.cpu:7.1f} s CPU {cost.wall:7.1f} s wall  {cost.summary}", file=sys.stderr, flush=True)
            if args.save:
                args.save.parent.mkdir(parents=True, exist_ok=True)
                args.save.write_text(json.dumps([asdict(each) for each in costs], indent=1))
    finally:
        root.rmdir()
    against = {}
    if args.against:
        against = {each["path"]: FileCost(**each) for each in json.loads(args.against.read_text())}
    print_table(costs, against, args.top)
    return 1 if any(cost.returncode not in (0, 5) for cost in costs) else 0


if __name__ == "__main__":
    raise SystemExit(main())

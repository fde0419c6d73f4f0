"""A private PostgreSQL server for tests and benches: its own folder, a free 127.0.0.1 port, a password.

    cluster = PostgresCluster.start()          # None-safe: `binaries()` says whether one can start here
    url = cluster.new_database()               # postgresql://twl:PASSWORD@127.0.0.1:PORT/twl_1
    cluster.restart()                          # the same data and port (a store restart); or stop() ... start_again()
    cluster.destroy()                          # stopped and its folder removed
    with running_cluster() as cluster: ...     # the same, destroyed on leaving

It uses Debian's binaries (`apt-get install postgresql`: /usr/lib/postgresql/<version>/bin, the
newest version found). initdb refuses to run as root, so under root the server runs as the
unprivileged `postgres` user (or `nobody`) through `runuser`, in a folder made theirs; as anyone
else it runs as that user. Durability settings are off (fsync): it is a test server.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from taskweaver_lite.testing.server_start import free_port as free_port  # where the tests have found it

SUPERUSER = "twl"
START_TIMEOUT_SECONDS = 300  # pg_ctl waits until it accepts connections: a loaded machine may take minutes


def binaries() -> Path | None:
    """The folder of the newest installed PostgreSQL server binaries (initdb, pg_ctl); None when there are none."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found.sort(key=lambda folder: int(folder.parent.name) if folder.parent.name.isdigit() else 0)
    return found[-1] if found else None


class PostgresCluster:
    """One running PostgreSQL server in a temporary folder; stop or destroy it when done."""

    def __init__(self, folder: Path, *, bin_dir: Path, port: int, password: str, run_as: str | None) -> None:
        self.folder = folder
        self.bin_dir = bin_dir
        self.port = port
        self.password = password
        self.run_as = run_as  # the unprivileged user the server runs as (None: this process's user)
        self._databases = 0
        self._lock = threading.Lock()

    @classmethod
    def start(cls) -> PostgresCluster:
        """A new cluster, initialised and running; RuntimeError (with initdb's or pg_ctl's words) when it cannot start."""
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
        run_as = _unprivileged_user() if os.geteuid() == 0 else None
        folder = Path(tempfile.mkdtemp(prefix="twl-pg-"))
        cluster = cls(folder, bin_dir=bin_dir, port=free_port(), password=secrets.token_urlsafe(16), run_as=run_as)
        try:
            cluster._init()
            cluster.start_again()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _init(self) -> None:
        password_file = self.folder / "password"
        password_file.write_text(self.password + "\n", encoding="utf-8")
        password_file.chmod(0o600)
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.folder, password_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.folder / "data"), "-U", SUPERUSER, f"--pwfile={password_file}", "--auth=scram-sha-256",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        password_file.unlink()

    def start_again(self) -> None:
        """Start the server (again, after `stop`) on its port; returns once it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB"
        )
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-o", options, "-l", log, "-w", "-t", str(START_TIMEOUT_SECONDS), "start")

    def restart(self) -> None:
        """Stop the server and start it again (open connections are cut; the data and the port stay)."""
        self.stop()
        self.start_again()

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut), keeping its data and port."""
        if (self.folder / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server and remove its folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        """The address of `database` with the superuser's password (or `password`)."""
        return f"postgresql://{SUPERUSER}:{password or self.password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database; returns its URL."""
        with self._lock:
            self._databases += 1
            name = f"twl_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # our own name, not user text
        return self.url(name)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.folder, check=False)
        if done.returncode != 0:
            log = self.folder / "server.log"
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}\n{tail}")


@contextmanager
def running_cluster() -> Iterator[PostgresCluster]:
    """A cluster for the `with` block, destroyed on leaving it."""
    cluster = PostgresCluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()


def _unprivileged_user() -> str:
    """`postgres` when it exists (Debian's package makes it), else `nobody`."""
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root with neither a `postgres` nor a `nobody` user to run PostgreSQL as (initdb refuses root)")

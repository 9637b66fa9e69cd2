"""A throwaway PostgreSQL server for tests and benchmarks: a fresh cluster in a temp dir,
listening on 127.0.0.1 and a Unix socket in that dir, stopped and deleted at the end.

It uses the Debian package's binaries (/usr/lib/postgresql/<version>/bin, the newest version
there; scripts/bootstrap.sh installs the package). initdb and postgres refuse to run as root,
so when the tests run as root (containers, CI) every server command runs as the `postgres`
user the package creates, through `runuser -u postgres --`, in a temp dir owned by that user
(mkdtemp under /tmp: pytest's own tmp dirs are private to root). As anyone else they run as
that user.

The server can be stopped and started again on the same port and data (`stop`, `start`),
which is how a test takes the database away from a running store and gives it back. A restart
is charged to whoever made the server (the session fixture, for `pg_server`), not to the test
that restarted it (tests/processes.py). `stop` returns once the postmaster and every process
under it have exited, and kills by PID (with a warning) what pg_ctl's shutdown left.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests import processes

STOP_WAIT_S = 10.0  # after pg_ctl says stopped, for the postmaster's processes to be gone

log = logging.getLogger(__name__)


class PostgresMissing(RuntimeError):
    """PostgreSQL's server binaries (or, as root, the `postgres` user) are not installed."""


def find_bindir() -> Path:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for bindir in reversed(candidates):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    raise PostgresMissing("PostgreSQL server binaries not found under /usr/lib/postgresql")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    def __init__(self, root: Path, bindir: Path, options: Sequence[str] = ()) -> None:
        self.root = root
        self.bindir = bindir
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()
        self.options = list(options)
        self._owner = processes.current_owner()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing("no `postgres` user to run the server as") from None
            if shutil.which("runuser") is None:
                raise PostgresMissing("runuser (util-linux) is missing")
            os.chown(root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _command(self, program: str, *args: str) -> None:
        command = [*self._as_user, str(self.bindir / program), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n{log}"
            )

    def init(self) -> None:
        self._command(
            "initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip

    def start(self) -> None:
        server_options = " ".join(
            [f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=127.0.0.1", *self.options]
        )
        with processes.attributed_to(self._owner):
            self._command(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", server_options,
                "-w", "-t", "60", "start",
            )  # fmt: skip

    def stop(self) -> None:
        """pg_ctl's fast shutdown, then wait (bounded) until the postmaster and its children
        are gone; what is left is killed by PID. pg_ctl returns when the pid file is removed,
        a moment before the processes exit."""
        server = self._postmaster()
        table = processes.scan()
        tree = [server, *processes.descendants(table, server.pid)] if server else []
        try:
            self._command("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            if left := processes.wait_gone(tree, STOP_WAIT_S):
                log.warning(
                    "killing what PostgreSQL's shutdown left: %s",
                    "; ".join(f"pid {p.pid}: {processes.cmdline(p)}" for p in left),
                )
                processes.stop_tree(left)
            processes.reap(tree)  # the postmaster, adopted by pytest (tests/processes.py)

    def _postmaster(self) -> processes.Proc | None:
        """The running postmaster, from the first line of postmaster.pid (checked to be a
        postgres process: a stale file's PID may have been reused)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        server = processes.read_stat(pid)
        return server if server is not None and server.comm == "postgres" else None

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _psql(self, sql: str) -> None:
        self._command("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                      "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql)  # fmt: skip


@contextmanager
def postgres_server(options: Sequence[str] = ()) -> Iterator[PostgresServer]:
    """A running server for the `with` block; PostgresMissing when it cannot be had."""
    bindir = find_bindir()
    root = Path(tempfile.mkdtemp(prefix="topowatch-pg-"))
    try:
        server = PostgresServer(root, bindir, options)
        server.init()
        server.start()
        try:
            yield server
        finally:
            if (server.data / "postmaster.pid").exists():
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)

"""A real PostgreSQL 15 server for tests and benches, started and stopped by PID.

    server = PostgresServer(folder, port=54321, password="secret")
    server.start()                      # initdb on first use, then start; waits until it answers
    server.create_database("portal_x")  # idempotent
    os.environ["DATABASE_URL"] = server.url("portal_x")
    server.restart()                    # fast shutdown, start again (same data)
    server.stop()                       # fast shutdown, waits for the PID to end

API (other tests rely on it; keep it):
- `PostgresServer(data_dir, *, host="127.0.0.1", port, password, netns=None,
  settings=None)`: `data_dir` is the cluster's folder (PGDATA); `host` and
  `port` what it listens on over TCP; `password` the password of the
  superuser `portal` (SCRAM, for TCP and the unix socket alike); `netns`
  the name of a network namespace (`/var/run/netns/<netns>`) to run the
  server in; `settings` extra `postgresql.conf` values (`-c name=value`)
  over the test defaults below.
- `start()`, `stop()`, `restart()`, `create_database(name)`, `url(dbname)`
  (a `postgres://portal:<password>@host:port/dbname` URL), `pid` (the
  postmaster's PID while it runs, else None), `socket_dir` (the folder of
  its unix socket), `log_path`.

Debian's binaries (/usr/lib/postgresql/15/bin) are used as they are. The
server runs as the `postgres` system user (PostgreSQL refuses root) through
`setpriv`, which execs in place, so the PID we hold is the postmaster's own
(`runuser` would fork and stay in between); under `nsenter --net=...` when a
namespace is given, which execs in place too.

The data folder is made and given to `postgres` (0700). Its parents must let
that user pass: a parent of ours (root's) that others cannot enter gets the
group `postgres` and the group's execute bit only (0710: pass through, list
and read nothing), the least we can open; see SECURITY.md, finding 12.

Test defaults: `fsync=off` (a killed server loses nothing the OS already
has; only a machine crash would) and room for many connections, since
gunicorn workers and node agents each keep their own.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

BIN = Path("/usr/lib/postgresql/15/bin")
SUPERUSER = "portal"
SYSTEM_USER = "postgres"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0

TEST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
    # Lock waits and deadlocks show in the server log (log_path) when a test fails.
    "log_lock_waits": "on",
    "deadlock_timeout": "1s",
}


class PostgresError(RuntimeError):
    pass


class PostgresServer:
    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int, password: str,
                 netns: str | None = None, settings: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = int(port)
        self.password = password
        self.netns = netns
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.socket_dir = self.data_dir / "socket"
        self.log_path = self.data_dir / "server.log"
        self._process: subprocess.Popen | None = None

    # -- life cycle ------------------------------------------------------

    @property
    def pid(self) -> int | None:
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def start(self) -> None:
        if self.pid is not None:
            return
        if not (BIN / "postgres").exists():
            raise PostgresError(f"{BIN / 'postgres'} is missing: install Debian's postgresql (15)")
        _give_to_postgres(self.data_dir)
        self._stop_leftover()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        _chown_postgres(self.socket_dir)
        command = [str(BIN / "postgres"), "-D", str(self.data_dir), "-h", self.host, "-p", str(self.port),
                   "-k", str(self.socket_dir)]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self._process = subprocess.Popen(self._as_postgres(command), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=_server_env(), start_new_session=True)
        self._wait_until_it_answers()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: running transactions end, a checkpoint is
        written), then wait for the postmaster to exit."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            # Immediate shutdown; the next start recovers from the WAL.
            process.send_signal(signal.SIGQUIT)
            process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- databases ---------------------------------------------------------

    def url(self, dbname: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgres://{SUPERUSER}:{quote(self.password, safe='')}@{host}:{self.port}/{quote(dbname, safe='')}"

    def create_database(self, name: str) -> None:
        """Create database `name` unless it exists."""
        from psycopg import sql

        with self.connect("postgres", autocommit=True) as connection:
            if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                return
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        from psycopg import sql

        with self.connect("postgres", autocommit=True) as connection:
            connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def connect(self, dbname: str = "postgres", *, autocommit: bool = False):
        """A psycopg connection over the unix socket (works from outside the
        server's network namespace too)."""
        import psycopg

        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=SUPERUSER, password=self.password,
                               dbname=dbname, autocommit=autocommit, connect_timeout=5)

    # -- inside ------------------------------------------------------------

    def _stop_leftover(self) -> None:
        """A server that a killed run left on this data folder (its PID in
        postmaster.pid, its command line naming the folder): fast shutdown."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if not command or not command[0].endswith(b"postgres") or str(self.data_dir).encode() not in command:
            return
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _as_postgres(self, command: list[str]) -> list[str]:
        # setpriv and nsenter both exec in place: the PID is the server's.
        wrapped = ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--", *command]
        if self.netns:
            wrapped = ["nsenter", f"--net=/var/run/netns/{self.netns}", "--", *wrapped]
        return wrapped

    def _initdb(self) -> None:
        # The password goes through a file only postgres can read, removed at once.
        handle, password_file = tempfile.mkstemp(prefix="pg-password-")
        try:
            os.write(handle, self.password.encode() + b"\n")
            os.close(handle)
            _chown_postgres(Path(password_file))
            result = subprocess.run(
                ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--",
                 str(BIN / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, f"--pwfile={password_file}",
                 "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-sync"],
                capture_output=True, text=True, env=_server_env(), timeout=300)
        finally:
            os.unlink(password_file)
        if result.returncode != 0:
            raise PostgresError(f"initdb in {self.data_dir} failed:\n{result.stdout}{result.stderr}")

    def _wait_until_it_answers(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise PostgresError(f"postgres exited at start (see {self.log_path}):\n{_tail(self.log_path)}")
            try:
                with self.connect("postgres"):
                    return
            except psycopg.OperationalError as exc:
                if "password authentication failed" in str(exc):
                    self.stop()
                    raise PostgresError(f"{self.data_dir} was made with another password for {SUPERUSER}") from exc
                last = exc
            time.sleep(0.1)
        self.stop()
        raise PostgresError(f"postgres did not answer within {START_TIMEOUT_SECONDS:.0f} s: {last}")


def _server_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "TZ": "UTC"}


def _chown_postgres(path: Path) -> None:
    user = pwd.getpwnam(SYSTEM_USER)
    os.chown(path, user.pw_uid, user.pw_gid)


def _give_to_postgres(data_dir: Path) -> None:
    """Make `data_dir` postgres's own (0700) and let postgres pass through
    its parents, opening as little as possible (the module docstring)."""
    group = grp.getgrnam(SYSTEM_USER).gr_gid
    user = pwd.getpwnam(SYSTEM_USER).pw_uid
    data_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for parent in reversed(data_dir.parents):
        info = parent.stat()
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o001 or (info.st_gid == group and mode & 0o010) or info.st_uid == user:
            continue
        if info.st_uid != os.geteuid() or info.st_gid not in (0, group):
            raise PostgresError(f"{parent} (mode {mode:o}) does not let the postgres user reach {data_dir}, "
                                "and it is not ours to open")
        os.chown(parent, -1, group)
        os.chmod(parent, (mode & 0o700) | 0o010)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    _chown_postgres(data_dir)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

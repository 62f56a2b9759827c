"""tests/postgres_server.py, which the PostgreSQL pass, the multi-host tests
and bench/job_list.py start their servers with: a real PostgreSQL 15, run as
the postgres user, stopped by PID, with a password."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import services as test_services
from tests.cluster import free_port
from tests.settings import RUN_ID, TEST_VAR


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    # Beside the run's folder, not in it: the run's var folder stays 0700.
    # One cluster for the module (initdb once); each test starts its server.
    path = TEST_VAR.parent / f"pg-selftest-{RUN_ID}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(folder) -> Iterator[object]:
    from tests.postgres_server import BIN, PostgresServer

    if not (BIN / "postgres").exists():
        test_services.unavailable("PostgreSQL 15 (Debian's postgresql; scripts/test installs it)")
    running = PostgresServer(folder / "data", port=free_port(), password="pw with spaces/and:colons@")
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_it_runs_as_the_postgres_user_and_answers_at_its_url_with_the_password(server):
    import pwd

    import psycopg

    uid = next(line for line in Path(f"/proc/{server.pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert int(uid.split()[1]) == pwd.getpwnam("postgres").pw_uid  # the PID we hold is the server's own
    server.create_database("made_twice")
    server.create_database("made_twice")  # no error the second time
    with psycopg.connect(server.url("made_twice")) as connection:
        assert connection.execute("SELECT current_user, current_database()").fetchone() == ("portal", "made_twice")
    wrong = server.url("made_twice").replace("pw%20with", "px%20with")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5)


def test_it_keeps_the_data_to_postgres_and_opens_its_parents_to_it_only_to_pass(server, folder):
    data = stat.S_IMODE(server.data_dir.stat().st_mode)
    assert data == 0o700 and server.data_dir.stat().st_uid != os.geteuid()
    for parent in server.data_dir.parents:
        mode = stat.S_IMODE(parent.stat().st_mode)
        assert not mode & 0o006 or mode & 0o001, f"{parent} {mode:o}"  # never readable without being public
    import grp

    var = Path(__file__).resolve().parent.parent / "var"
    var_mode = stat.S_IMODE(var.stat().st_mode)
    assert var_mode & 0o007 == 0  # others: nothing
    assert var_mode & 0o070 in (0, 0o010)  # its group may pass, never list or read
    if var_mode & 0o010:
        assert grp.getgrgid(var.stat().st_gid).gr_name == "postgres"


def test_it_stops_restarts_on_the_same_data_and_stops_by_pid(server):
    server.create_database("kept")
    first = server.pid
    server.restart()
    assert server.pid not in (None, first) and not _alive(first)
    with server.connect("kept") as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)
    second = server.pid
    server.stop()
    assert server.pid is None and not _alive(second)


def test_a_cluster_made_with_another_password_is_named_as_such(server):
    from tests.postgres_server import PostgresError, PostgresServer

    server.stop()
    other = PostgresServer(server.data_dir, port=server.port, password="not the one it was made with")
    with pytest.raises(PostgresError, match="another password"):
        other.start()
    assert other.pid is None

"""Test fixtures shared by the whole suite.

The suite runs against one committed SQLite database under var/test, made
fresh for each session, because the things under test run in other
processes (gunicorn, node agents) and must see what the tests write. Tests
therefore never rely on an empty database: every test makes its own users
and jobs with unique names (see `make_user`).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings

from tests import services as test_services
from tests.cluster import Cluster, remove_test_containers
from tests.browser import browser, page, portal_in_process  # noqa: F401  (fixtures)
from tests.helpers import new_user, unique  # noqa: F401  (unique: tests import it from here)
from tests import settings as test_settings
from tests.settings import TEST_VAR


def pytest_configure(config: pytest.Config) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = TEST_VAR / f"portal.sqlite3{suffix}"
        if path.exists():
            path.unlink()
    if test_settings.TEST_DATABASE == "postgres":
        _start_test_postgres()
    shutil.rmtree(TEST_VAR / "storage", ignore_errors=True)
    shutil.rmtree(TEST_VAR / "stage", ignore_errors=True)
    test_services.remove_stale_runs()


def pytest_unconfigure(config: pytest.Config) -> None:
    test_services.stop_all()
    _stop_test_postgres()


_postgres: list = []


def _start_test_postgres() -> None:
    """PORTAL_TEST_DATABASE=postgres: the slot's server (tests/settings.py)
    with a fresh database of this run's; databases of earlier runs of the
    slot (killed before they could drop theirs) are dropped."""
    from tests.postgres_server import PostgresServer

    server = PostgresServer(test_settings.POSTGRES_DIR, port=test_settings.POSTGRES_PORT,
                            password=test_settings.POSTGRES_PASSWORD)
    server.start()
    _postgres.append(server)
    with server.connect() as connection:
        stale = [name for (name,) in connection.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'portal\\_test\\_%'")]
    for name in stale:
        server.drop_database(name)
    server.create_database(test_settings.POSTGRES_DATABASE)


def _stop_test_postgres() -> None:
    from django.db import connections

    if not _postgres:
        return
    connections.close_all()
    server = _postgres.pop()
    try:
        server.drop_database(test_settings.POSTGRES_DATABASE)
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def _database(django_db_blocker) -> Iterator[None]:
    """Migrate the session's database and leave access open for every test.
    The private Redis starts here too when it can: saving a job wakes the
    scheduler through it."""
    from django.core.management import call_command

    if shutil.which("redis-server"):
        test_services.start_redis()
    django_db_blocker.unblock()
    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    yield


@pytest.fixture
def own_instance(redis_server, settings) -> Iterator[str]:
    """A PAI_INSTANCE of the test's own: its queues, flags and pass timings
    in the tests' Redis are apart from everyone else's, and removed after."""
    from jobs import queues

    settings.PAI_INSTANCE = f"pai-test-own-{uuid.uuid4().hex[:8]}"
    yield settings.PAI_INSTANCE
    redis = queues.connection()
    for key in redis.keys(f"*{settings.PAI_INSTANCE}*"):
        redis.delete(key)


@pytest.fixture(scope="session")
def redis_server() -> str:
    """A Redis of the test run's own, on a unix socket under var/test."""
    test_services.need("redis-server")
    test_services.start_redis()
    return settings.REDIS_URL


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The Docker engine at DOCKER_HOST, with the local test images built."""
    test_services.need_docker()
    return settings.DOCKER_HOST


@pytest.fixture(scope="session")
def static_files() -> None:
    """The portal serves collected static files (whitenoise's manifest).
    Collected by a process with the portal's own settings: this one uses
    plain static storage for pages rendered by the test client."""
    import subprocess
    import sys

    from tests.cluster import ROOT, process_env

    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=process_env(),
                   check=True, timeout=300)


@pytest.fixture(scope="session")
def cluster(redis_server, docker_engine, static_files) -> Iterator[Cluster]:
    """Two node agents (4 simulated V100s; 2 simulated TITANXs) and the
    portal under gunicorn, all real processes."""
    remove_test_containers()
    running = Cluster()
    try:
        running.start_agent("t-node-a", ports=running.port_range(0), gpus=4, gpu_type="V100")
        running.start_agent("t-node-b", ports=running.port_range(1), gpus=2, gpu_type="TITANX")
        running.start_portal()
        yield running
    finally:
        running.stop_all()
        remove_test_containers()


@pytest.fixture(scope="session")
def hdfs_cluster():
    """A real HDFS (tests/hdfs_cluster.py): one minicluster JVM per session,
    started only when a test asks for it, stopped by PID at the end."""
    from tests import hdfs_cluster as minicluster

    try:
        running = minicluster.start_session_cluster()
    except FileNotFoundError as exc:
        test_services.unavailable(f"{exc.args[0]} (for the HDFS minicluster; scripts/test installs it)")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def make_user() -> Iterator[Callable[..., object]]:
    """Users with unique names; their unfinished jobs are stopped after the
    test, so one failing test does not leave the cluster busy for the next."""
    from jobs.models import User

    made: list[User] = []

    def make(prefix: str = "user", *, admin: bool = False, password: str = "pw-for-tests-1") -> User:
        user = new_user(prefix, admin=admin, password=password)
        made.append(user)
        return user

    yield make
    _stop_jobs_of(made)


def _stop_jobs_of(users: list) -> None:
    from jobs import services
    from jobs.models import FINAL_STATES, Job

    for job in Job.objects.filter(owner__in=users).exclude(state__in=FINAL_STATES):
        try:
            services.job_stop(job=job, by=job.owner)
        except services.JobStateError:
            pass


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def alice_client(alice):
    """Django's test client, signed in as alice."""
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def admin_user(make_user):
    return make_user("admin", admin=True)

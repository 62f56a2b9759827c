"""Test fixtures shared by the whole suite.

The suite runs against one committed SQLite database under var/test, made
fresh for each session, because the things under test run in other
processes (gunicorn, node agents) and must see what the tests write. Tests
therefore never rely on an empty database: every test makes its own users
and jobs with unique names (see `make_user`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings

from tests import services as test_services
from tests.settings import TEST_ENV, TEST_VAR


def pytest_configure(config: pytest.Config) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = TEST_VAR / f"portal.sqlite3{suffix}"
        if path.exists():
            path.unlink()
    shutil.rmtree(TEST_VAR / "storage", ignore_errors=True)
    shutil.rmtree(TEST_VAR / "stage", ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    test_services.stop_all()


@pytest.fixture(scope="session", autouse=True)
def _database(django_db_blocker) -> Iterator[None]:
    """Migrate the session's database and leave access open for every test."""
    from django.core.management import call_command

    django_db_blocker.unblock()
    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    yield


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


_counter = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{next(_counter)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def make_user() -> Callable[..., object]:
    from jobs.models import User

    def make(prefix: str = "user", *, admin: bool = False, password: str = "pw-for-tests-1") -> User:
        user = User.objects.create_user(unique(prefix), password=password, is_staff=admin, is_superuser=admin)
        user.test_password = password  # type: ignore[attr-defined]
        return user

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def admin_user(make_user):
    return make_user("admin", admin=True)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for processes the tests start: the test settings."""
    env = dict(os.environ)
    env.update(TEST_ENV)
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    env.update(extra)
    return env

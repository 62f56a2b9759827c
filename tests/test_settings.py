"""Settings come from the environment and fail loudly on bad values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal import env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("reader,value,message", [
    (lambda: env.env_bool("X_TEST"), "maybe", "X_TEST='maybe': expected one of true/false"),
    (lambda: env.env_int("X_TEST", 1), "ten", "X_TEST='ten': expected a whole number"),
    (lambda: env.env_int("X_TEST", 1, minimum=5), "2", "X_TEST=2: expected at least 5"),
    (lambda: env.env_float("X_TEST", 1.0), "fast", "X_TEST='fast': expected a number"),
    (lambda: env.env_choice("X_TEST", "a", ("a", "b")), "c", "X_TEST='c': expected one of a, b"),
])
def test_it_refuses_bad_values_naming_the_variable(monkeypatch, reader, value, message):
    monkeypatch.setenv("X_TEST", value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        reader()


def _manage(*args: str, **environ: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_"))}
    base.update(environ)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=120)


def test_it_fails_at_start_up_without_a_secret_key(tmp_path):
    result = _manage("check", PORTAL_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "PORTAL_SECRET_KEY is not set" in result.stderr


def test_it_fails_at_start_up_on_a_bad_database_url(tmp_path):
    result = _manage("check", PORTAL_VAR_DIR=str(tmp_path), PORTAL_SECRET_KEY="k" * 50, DATABASE_URL="nosuchdb://x")
    assert result.returncode != 0 and "DATABASE_URL" in result.stderr


def test_it_passes_the_deploy_check_with_production_settings(tmp_path):
    result = _manage("check", "--deploy", "--fail-level", "WARNING", PORTAL_VAR_DIR=str(tmp_path),
                     PORTAL_SECRET_KEY="a-long-random-production-secret-" + "k9Z" * 20, PORTAL_HTTPS="1",
                     PORTAL_ALLOWED_HOSTS="portal.example.org")
    assert result.returncode == 0, result.stdout + result.stderr


def test_env_example_documents_every_variable_the_settings_read():
    source = (ROOT / "portal" / "settings.py").read_text()
    read = set(re.findall(r'env_[a-z]+\(\s*"([A-Z_]+)"', source))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert read and read <= documented, sorted(read - documented)

"""Finding 14: the secret key scripts/run makes was shorter than 50
characters, so `manage.py check --deploy` warned in HTTPS mode. The key is
now long enough, a short one kept from an older checkout is made again, and
the deployment check passes without a warning."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.cluster import ROOT, process_env


def _secret(var: Path, name: str, *size: str) -> str:
    result = subprocess.run(["bash", "-c", 'source scripts/lib.sh; secret "$@"', "secret", name, *size],
                            cwd=ROOT, env={**os.environ, "PORTAL_VAR_DIR": str(var)},
                            capture_output=True, text=True, check=True, timeout=30)
    return result.stdout


def _run_key(var: Path) -> str:
    """The key exactly as scripts/run asks for it."""
    line = next(l for l in (ROOT / "scripts" / "run").read_text().splitlines() if "PORTAL_SECRET_KEY:-" in l)
    size = line.split("secret secret_key", 1)[1].split(")", 1)[0].split()
    return _secret(var, "secret_key", *size)


def test_it_makes_a_key_that_passes_the_deployment_check(tmp_path):
    key = _run_key(tmp_path)
    assert len(key) >= 50
    env = process_env(PORTAL_HTTPS="1", PORTAL_SECRET_KEY=key, PORTAL_DEBUG="0")
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_replaces_a_short_key_kept_from_before_and_keeps_it_private(tmp_path):
    (tmp_path / "secret_key").write_text("short-old-key")
    key = _run_key(tmp_path)
    assert len(key) >= 50 and key != "short-old-key"
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    assert _run_key(tmp_path) == key  # made once, then kept

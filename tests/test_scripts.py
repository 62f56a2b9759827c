"""The set-up scripts' process records: scripts/test keeps its own, so a test
run beside a running portal never drops what scripts/run started (seen:
scripts/stop then said "stopped" while the portal kept running)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import docker
import pytest
from django.conf import settings

from jobs.node import launcher
from tests.cluster import ROOT


def _bash(var, script: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/lib.sh as scripts/run sources it, or as scripts/test does with
    PORTAL_RUN_SET=test (this test itself may run under scripts/test)."""
    clean = {key: value for key, value in os.environ.items() if key != "PORTAL_RUN_SET"}
    return subprocess.run(["bash", "-c", f'source scripts/lib.sh; {script}'], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**clean, "PORTAL_VAR_DIR": str(var), **env})


def test_it_keeps_the_tests_records_apart_from_the_portals(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # Reaped as soon as it ends, as the scripts' shell reaps its children:
    # a zombie would still answer `kill -0`.
    reaper = threading.Thread(target=sleeper.wait, daemon=True)
    reaper.start()
    try:
        portal = _bash(tmp_path, f'echo {sleeper.pid} > "$RUN/agent.pid"; echo agent >> "$RUN/started"; echo "$RUN"')
        # What scripts/test does first, and at its end.
        test = _bash(tmp_path, 'rm -f "$RUN/started"; stop_started; echo "$RUN"', PORTAL_RUN_SET="test")
        assert portal.stdout.strip() != test.stdout.strip()
        assert sleeper.poll() is None
        assert (tmp_path / "run" / "started").read_text().split() == ["agent"]
        # scripts/stop's part: the portal's record stops the portal's process.
        stopped = _bash(tmp_path, "stop_started && echo all-stopped")
        assert "all-stopped" in stopped.stdout, stopped.stderr
        reaper.join(timeout=30)
        assert sleeper.poll() is not None
        assert not (tmp_path / "run" / "started").exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


@pytest.mark.services
def test_the_dockerd_it_starts_isolates_one_task_jobs_on_its_default_bridge():
    """scripts/lib.sh starts dockerd with its default bridge named for the
    node's firewall and with traffic between containers off: the node agent
    then runs one-task jobs there (jobs/node/launcher/docker.py). Another
    engine (one that answered before the scripts ran) is its owner's."""
    if os.environ.get("PORTAL_TEST_DOCKERD_STARTED") != "1":
        pytest.skip("scripts/test did not start this Docker engine: its set-up is not the scripts'")
    engine = launcher.engine_for(settings.DOCKER_HOST)
    options = docker.from_env().api.inspect_network("bridge")["Options"]
    assert options["com.docker.network.bridge.name"] == "pai-default"
    assert options["com.docker.network.bridge.enable_icc"] == "false"
    assert engine.isolating_default_network() == "bridge"


def test_make_venv_works_on_a_fresh_checkout_and_remakes_a_foreign_one(tmp_path):
    """make_venv as scripts/test runs it (set -euo pipefail) in a checkout
    with no .venv yet: reading the missing pyvenv.cfg must not end the script
    (seen: CI exited 2 after one second). A .venv made from another
    interpreter is made again. An empty requirements.txt keeps pip quick."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "requirements.txt").write_text("")
    script = ('set -euo pipefail; source scripts/lib.sh; '
              f'ROOT={checkout}; VENV="$ROOT/.venv"; PY="$VENV/bin/python"; make_venv; echo venv-ready')
    first = _bash(tmp_path / "var", script)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "venv-ready" in first.stdout
    assert (checkout / ".venv" / "bin" / "python").exists()
    assert "making .venv again" not in first.stdout

    config = checkout / ".venv" / "pyvenv.cfg"
    config.write_text(config.read_text().replace("home = ", "home = /elsewhere", 1))
    again = _bash(tmp_path / "var", script)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "making .venv again" in again.stdout and "/elsewhere" in again.stdout
    assert "/elsewhere" not in config.read_text()

"""Joining a node with a join token: tokens (made, used, expired, revoked,
wrong), the join endpoint and what it hands over, `manage.py node_token`,
the Nodes page's token panel, and `scripts/join-node` really starting an
agent (foreground and background, stopped by scripts/stop) that registers
and runs a job on the test engine."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.api.views.nodes import JOIN_LIMIT_NAME
from jobs.models import Node, NodeJoinToken, State, TaskAttempt
from jobs.services import join_tokens, ratelimit, tokens
from jobs.services.node_settings import HANDED_OVER, NOT_HANDED_OVER
from tests.cluster import ROOT, Process, wait_for
from tests.helpers import config, role, submit, wait_state
from tests.settings import TEST_ENV, TEST_VAR

GPU_TYPE = "JOINTEST"


def _join(client: Client, key: str | None, address: str) -> tuple[int, dict]:
    headers = {"REMOTE_ADDR": address}
    if key is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    answer = client.post("/api/v2/nodes/join", **headers)
    return answer.status_code, answer.json()


@pytest.fixture
def address(redis_server):
    """A client address of this test's own, so failed joins elsewhere do not count here."""
    made = f"10.77.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250 + 1}"
    yield made
    ratelimit.address_reset(kind=JOIN_LIMIT_NAME, address=made)


# -------------------------------------------------------------- the tokens


def test_it_hands_a_valid_token_the_node_settings(admin_user, address, settings):
    made = join_tokens.join_token_create(by=admin_user, seconds=600, label="rack 3")
    assert made.key.startswith("pjt_") and made.token.prefix == made.key[:12]
    assert NodeJoinToken.objects.get(pk=made.token.pk).key_hash != made.key  # only its digest is stored
    status, body = _join(Client(), made.key, address)
    assert status == 200, body
    handed = body["settings"]
    assert handed["DATABASE_URL"] == settings.PORTAL_NODE_DATABASE_URL == TEST_ENV["DATABASE_URL"]
    assert handed["REDIS_URL"] == TEST_ENV["REDIS_URL"]
    assert handed["PORTAL_SECRET_KEY"] == settings.SECRET_KEY
    assert handed["PAI_INSTANCE"] == TEST_ENV["PAI_INSTANCE"] and handed["STORAGE_BACKEND"] == "local"
    assert handed["JOB_SUBNET_POOL"] == TEST_ENV["JOB_SUBNET_POOL"]
    assert handed["NODE_HEARTBEAT_SECONDS"] == TEST_ENV["NODE_HEARTBEAT_SECONDS"]
    assert not set(handed) & {"PORTAL_VAR_DIR", "DOCKER_HOST", "METRICS_TOKEN", "PORTAL_NODE_DATABASE_URL"}
    # The tests' database and Redis are on this machine only: said so.
    database_warning = "SQLite" if handed["DATABASE_URL"].startswith("sqlite") else "database URL names loopback"
    assert any(database_warning in w for w in body["warnings"]), body["warnings"]
    assert any("Redis URL is a unix socket" in w for w in body["warnings"])
    token = NodeJoinToken.objects.get(pk=made.token.pk)
    assert token.uses == 1 and token.last_used_from == address and token.last_used_at is not None


def test_it_hands_nodes_the_addresses_given_for_them(admin_user, address, settings):
    settings.PORTAL_NODE_DATABASE_URL = "postgres://pai:secret@db.example:5432/portal"
    settings.PORTAL_NODE_REDIS_URL = "redis://:secret@redis.example:6379/0"
    made = join_tokens.join_token_create(by=admin_user, seconds=600)
    status, body = _join(Client(), made.key, address)
    assert status == 200
    assert body["settings"]["DATABASE_URL"] == "postgres://pai:secret@db.example:5432/portal"
    assert body["settings"]["REDIS_URL"] == "redis://:secret@redis.example:6379/0"
    assert not any("database" in w.lower() and "PORTAL_NODE_DATABASE_URL" in w for w in body["warnings"])


def test_it_refuses_wrong_expired_and_revoked_tokens_saying_why(admin_user, alice, address):
    client = Client()
    status, body = _join(client, None, address)
    assert (status, body["code"], body["reason"]) == (401, "InvalidJoinTokenError", "missing")
    status, body = _join(client, "pjt_not-a-token-at-all", address)
    assert (status, body["reason"]) == (401, "unknown") and "not known to this portal" in body["message"]
    api_token = tokens.token_create(user=admin_user, lifetime=timedelta(hours=1)).key
    assert _join(client, api_token, address)[1]["reason"] == "unknown"  # an API token is no join token
    expired = join_tokens.join_token_create(by=admin_user, seconds=600)
    NodeJoinToken.objects.filter(pk=expired.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    status, body = _join(client, expired.key, address)
    assert (status, body["reason"]) == (401, "expired") and expired.token.prefix in body["message"]
    revoked = join_tokens.join_token_create(by=admin_user, seconds=600)
    assert join_tokens.join_token_revoke(token=revoked.token)
    assert not join_tokens.join_token_revoke(token=revoked.token)
    status, body = _join(client, revoked.key, address)
    assert (status, body["reason"]) == (401, "revoked") and "revoked" in body["message"]
    assert "settings" not in body
    assert NodeJoinToken.objects.get(pk=revoked.token.pk).uses == 0


def test_it_limits_failed_joins_like_failed_logins(admin_user, address, settings):
    settings.LOGIN_FAILURES_ALLOWED = 3
    client = Client()
    for _ in range(3):
        assert _join(client, "pjt_guess", address)[0] == 401
    good = join_tokens.join_token_create(by=admin_user, seconds=600)
    status, body = _join(client, good.key, address)
    assert (status, body["code"]) == (429, "TooManyRequestsError")
    assert _join(client, good.key, "10.78.0.1")[0] == 200  # another address is not held up
    ratelimit.address_reset(kind=JOIN_LIMIT_NAME, address="10.78.0.1")


def test_failed_joins_from_many_addresses_never_hold_up_a_valid_token_from_another(admin_user, settings):
    """Finding 27: failed joins counted under one name over all addresses,
    like a username's: an attacker spreading bad tokens over a few dozen
    addresses (an IPv6 /64 has plenty) held up every node joining from a
    new address. A token is 256 random bits, so guessing is hopeless
    whatever the total; each address is still held up on its own."""
    settings.LOGIN_FAILURES_ALLOWED = 3
    client = Client()
    attackers = [f"10.79.{uuid.uuid4().int % 250}.{n + 1}" for n in range(2 * ratelimit.USERNAME_FACTOR)]
    newcomer = f"10.80.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250 + 1}"
    try:
        for attacker in attackers:
            for _ in range(settings.LOGIN_FAILURES_ALLOWED):
                assert _join(client, "pjt_guess", attacker)[0] == 401
            assert _join(client, "pjt_guess", attacker)[0] == 429  # each guesser is still held up
        good = join_tokens.join_token_create(by=admin_user, seconds=600)
        assert _join(client, good.key, newcomer)[0] == 200
    finally:
        for address in (*attackers, newcomer):
            ratelimit.address_reset(kind=JOIN_LIMIT_NAME, address=address)


def test_admins_make_list_and_revoke_tokens_through_the_api(admin_user, address):
    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=admin_user, lifetime=timedelta(hours=1)).key}")
    made = api.post("/api/v2/node-join-tokens", {"ttl": 120, "label": "api"}, content_type="application/json")
    assert made.status_code == 201
    key, prefix = made.json()["token"], made.json()["prefix"]
    assert made.json()["valid"] and made.json()["createdBy"] == admin_user.username
    assert prefix in [t["prefix"] for t in api.get("/api/v2/node-join-tokens").json()]
    assert "token" not in api.get("/api/v2/node-join-tokens").json()[0]
    too_long = api.post("/api/v2/node-join-tokens", {"ttl": 10 ** 9}, content_type="application/json")
    assert too_long.status_code == 400 and "ttl" in too_long.json()["message"]
    assert api.delete(f"/api/v2/node-join-tokens/{prefix}").json()["valid"] is False
    assert api.delete("/api/v2/node-join-tokens/pjt_nothing").status_code == 404
    assert _join(Client(), key, address)[1]["reason"] == "revoked"


def test_the_nodes_page_makes_a_token_shown_once_and_revokes_it(admin_user, address):
    client = Client()
    client.force_login(admin_user)
    answer = client.post(reverse("jobs:node_join_token_create"), {"label": "page", "ttl": 3600}, follow=True)
    html = answer.content.decode()
    key = re.search(r'id="new-join-token" class="mono" readonly value="(pjt_[^"]+)"', html).group(1)
    assert "scripts/join-node" in html
    assert key not in client.get(reverse("jobs:nodes")).content.decode()  # shown once
    token = NodeJoinToken.objects.get(prefix=key[:12])
    assert token.label == "page" and token.created_by == admin_user
    assert timedelta(minutes=59) < token.expires_at - token.created_at <= timedelta(hours=1)
    bad = client.post(reverse("jobs:node_join_token_create"), {"ttl": 5}, follow=True).content.decode()
    assert "No join token was made: ttl" in bad
    client.post(reverse("jobs:node_join_token_revoke", args=[token.pk]))
    assert _join(Client(), key, address)[1]["reason"] == "revoked"


def test_node_token_makes_lists_and_revokes(address):
    out, err = StringIO(), StringIO()
    call_command("node_token", "--ttl", "300", "--label", "cli", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert key.startswith("pjt_") and "valid until" in err.getvalue()
    assert _join(Client(), key, address)[0] == 200
    listed = StringIO()
    call_command("node_token", "--list", stdout=listed)
    line = next(line for line in listed.getvalue().splitlines() if line.startswith(key[:12]))
    assert "valid" in line and "uses 1" in line and "cli" in line
    with pytest.raises(CommandError, match="--ttl 5: expected 60 to"):
        call_command("node_token", "--ttl", "5")
    with pytest.raises(CommandError, match="no join token starts with"):
        call_command("node_token", "--revoke", "pjt_zzzzzzzz")
    done = StringIO()
    call_command("node_token", "--revoke", key[4:12], stdout=done)
    assert done.getvalue().startswith(f"revoked {key[:12]}")
    assert _join(Client(), key, address)[1]["reason"] == "revoked"


def test_a_token_is_revoked_by_its_prefix_without_pjt_whatever_it_drew(monkeypatch):
    """The part after "pjt_" may be given to --revoke alone; argparse reads
    one starting with "-" as an option ("--revoke: expected one argument"),
    which failed the test above for one token in 64: no token starts so."""
    real = join_tokens.secrets.token_urlsafe
    drawn = iter(["-" + real(32)[1:], "Q" + real(32)[1:]])
    monkeypatch.setattr(join_tokens.secrets, "token_urlsafe", lambda nbytes: next(drawn))
    made = join_tokens.join_token_create(by=None, seconds=600)
    assert made.key.startswith("pjt_Q")
    done = StringIO()
    call_command("node_token", "--revoke", made.key[4:12], stdout=done)
    assert done.getvalue().startswith(f"revoked {made.key[:12]}")


def test_a_prefix_names_tokens_in_its_own_case_only(monkeypatch):
    """Token characters differ by case; SQLite's LIKE does not tell them apart."""
    real = join_tokens.secrets.token_urlsafe
    monkeypatch.setattr(join_tokens.secrets, "token_urlsafe", lambda nbytes: "aB" + real(nbytes)[2:])
    made = join_tokens.join_token_create(by=None, seconds=600)
    other_case = "pjt_Ab" + made.key[6:12]
    assert join_tokens.join_tokens_matching(made.key[:12]) == [made.token]
    assert made.token not in join_tokens.join_tokens_matching(other_case)
    with pytest.raises(CommandError, match="no join token starts with"):
        call_command("node_token", "--revoke", other_case)
    assert NodeJoinToken.objects.get(pk=made.token.pk).revoked_at is None


def test_every_setting_is_decided_for_nodes():
    """A setting the portal reads is handed to joining nodes or said not to be."""
    text = (ROOT / "portal" / "settings.py").read_text()
    read = set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]*)"', text))
    decided = set(HANDED_OVER) | set(NOT_HANDED_OVER)
    assert read - decided == set(), "decide in jobs/services/node_settings.py whether nodes get these"
    assert not set(HANDED_OVER) & set(NOT_HANDED_OVER)


def test_node_agent_on_a_fresh_shell_says_what_is_missing():
    done = subprocess.run([sys.executable, "manage.py", "node_agent"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                               "PORTAL_VAR_DIR": str(TEST_VAR)}, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "error: PORTAL_SECRET_KEY is not set" in done.stderr and "scripts/join-node" in done.stderr


# ----------------------------------------------------------- scripts/join-node


def _node_env() -> dict[str, str]:
    """A shell that holds none of the portal's settings: what the agent
    needs must come from the join."""
    env = {k: v for k, v in os.environ.items()
           if k not in HANDED_OVER and k not in ("DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update({"PORTAL_VAR_DIR": str(TEST_VAR), "PORTAL_RUN_SET": "node", "PYTHONUNBUFFERED": "1"})
    return env


def _ports(cluster, half: int) -> str:
    start = int(cluster.port_range(2).split("-")[0]) + 50 * half
    return f"{start}-{start + 49}"


def test_join_node_refuses_a_wrong_token_clearly(cluster, address):
    env = _node_env()
    done = subprocess.run(["scripts/join-node", cluster.base_url, "pjt_wrong", "--foreground", "--name", "t-join-no"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "HTTP 401" in done.stderr and "not known to this portal" in done.stderr, done.stderr
    assert not Node.objects.filter(name="t-join-no").exists()
    ratelimit.address_reset(kind=JOIN_LIMIT_NAME, address="127.0.0.1")


def test_join_node_in_the_foreground_starts_an_agent_that_runs_jobs(cluster, admin_user, alice):
    name = f"t-join-fg-{uuid.uuid4().hex[:4]}"
    key = join_tokens.join_token_create(by=admin_user, seconds=600).key
    log = TEST_VAR / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            ["scripts/join-node", cluster.base_url, key, "--foreground", "--name", name, "--address", "127.0.0.2",
             "--ports", _ports(cluster, 0), "--gpus", "1", "--gpu-type", GPU_TYPE, "--cpus", "4", "--memory-mb", "4096"],
            cwd=ROOT, env=_node_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    agent = Process(name, popen, log)
    try:
        def registered() -> bool:
            if not agent.alive():
                raise AssertionError(f"join-node exited:\n{agent.log_tail()}")
            return Node.objects.filter(name=name, status="READY", agent_pid__isnull=False).exists()

        wait_for(registered, timeout=120, what=f"node {name} to register")
        env_file = TEST_VAR / f"node-{name}.env"
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert f"PAI_INSTANCE='{TEST_ENV['PAI_INSTANCE']}'" in env_file.read_text()
        node = Node.objects.get(name=name)
        assert node.engine_marker == Node.objects.get(name="t-node-a").engine_marker
        job = submit(alice, config("joined", role(command="echo hello from $PAI_JOB_NAME", gpus=1), gpuType=GPU_TYPE))
        try:
            job = wait_state(job, State.SUCCEEDED, timeout=90)
        except AssertionError as exc:  # what the joined agent said: why it stopped, or stopped beating
            raise AssertionError(f"{exc}\njoined agent ({'running' if agent.alive() else 'exited'}):\n"
                                 f"{agent.log_tail(80)}") from None
        assert TaskAttempt.objects.get(job=job).node_name == name
    finally:
        agent.stop()
        (TEST_VAR / f"node-{name}.env").unlink(missing_ok=True)


def test_join_node_in_the_background_is_stopped_by_scripts_stop(cluster, admin_user):
    name = f"t-join-bg-{uuid.uuid4().hex[:4]}"
    key = join_tokens.join_token_create(by=admin_user, seconds=600).key
    env = _node_env()
    pidfile = TEST_VAR / "run" / "node" / f"node-agent-{name}.pid"
    try:
        done = subprocess.run(["scripts/join-node", cluster.base_url, "-", "--name", name, "--address", "127.0.0.2",
                               "--ports", _ports(cluster, 1), "--gpus", "1", "--gpu-type", GPU_TYPE + "BG"],
                              cwd=ROOT, env=env, input=key + "\n", capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"node {name} joined" in done.stdout
        pid = int(pidfile.read_text())
        node = Node.objects.get(name=name)
        assert node.agent_pid == pid and node.status == "READY"
        again = subprocess.run(["scripts/join-node", cluster.base_url, key, "--name", name], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
        assert again.returncode != 0 and "already runs" in again.stderr
        stop_env = {k: v for k, v in env.items() if k != "PORTAL_RUN_SET"}
        stopped = subprocess.run(["scripts/stop"], cwd=ROOT, env=stop_env, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not pidfile.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        wait_for(lambda: Node.objects.get(name=name).agent_pid is None, what="the node to be left")
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), 15)
            except (ProcessLookupError, ValueError):
                pass
        (TEST_VAR / f"node-{name}.env").unlink(missing_ok=True)


def test_join_node_writes_a_systemd_unit(cluster, admin_user, tmp_path: Path):
    name = f"t-join-sd-{uuid.uuid4().hex[:4]}"
    key = join_tokens.join_token_create(by=admin_user, seconds=600).key
    env = {**_node_env(), "PORTAL_SYSTEMD_DIR": str(tmp_path)}
    done = subprocess.run(["scripts/join-node", cluster.base_url, key, "--systemd", "--name", name, "--gpus", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    unit = (tmp_path / f"pai-node-{name}.service").read_text()
    assert f"EnvironmentFile={TEST_VAR}/node-{name}.env" in unit
    assert f'manage.py" "node_agent" "--name" "{name}" "--gpus" "2"' in unit
    assert key not in unit and "PORTAL_SECRET_KEY" not in unit
    assert not Node.objects.filter(name=name).exists()  # written, not started: no systemd here
    (TEST_VAR / f"node-{name}.env").unlink(missing_ok=True)

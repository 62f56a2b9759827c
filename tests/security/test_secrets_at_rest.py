"""Finding 12: var/ and the SQLite file were made with the default umask,
stored files were world-readable (0644), and jobs' SSH private keys sat in
the database as plain PEM text. Now var/ is 0700 (scripts/lib.sh and the
settings), the SQLite file 0600, users' files 0640 in 0750 folders, while
the staged code a container reads stays readable there; private keys are
sealed with a key derived from SECRET_KEY (fallbacks honoured) and the
owner still downloads a working key. SSH into a task with the downloaded
key, and tasks reaching each other with the sealed peer key, run in
tests/test_access.py."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from django.conf import settings
from django.db import connection
from django.test import Client

from jobs import keys, storage
from jobs.models import Job
from jobs.node.staging import CodeStager
from jobs.services import tokens
from jobs.services.access import ensure_job_key_pair
from jobs.storage.local import LocalBackend
from tests.cluster import ROOT, free_port, process_env, wait_for
from tests.helpers import config, hold_vc, role, submit
from tests.settings import PORT_BASE, RUN_ID


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_it_keeps_var_and_the_database_to_the_portals_user():
    connection.ensure_connection()
    database = Path(connection.settings_dict["NAME"])
    assert database.parent == settings.VAR_DIR
    assert _mode(settings.VAR_DIR) == 0o700
    for suffix in ("", "-wal", "-shm"):
        made = Path(f"{database}{suffix}")
        if made.exists():
            assert _mode(made) == 0o600, made


def test_it_closes_an_open_var_folder_at_start_up_and_in_the_scripts(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    os.chmod(var, 0o755)
    subprocess.run([sys.executable, "-c", "import portal.settings"], cwd=ROOT, check=True, timeout=60,
                   env=process_env(PORTAL_VAR_DIR=str(var), DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}"))
    assert _mode(var) == 0o700

    scripts_var = tmp_path / "scripts-var"
    scripts_var.mkdir(mode=0o755)
    os.chmod(scripts_var, 0o755)
    subprocess.run(["bash", "-c", "source scripts/lib.sh"], cwd=ROOT, check=True, timeout=30,
                   env={**os.environ, "PORTAL_VAR_DIR": str(scripts_var)})
    assert [_mode(p) for p in (scripts_var, scripts_var / "run", scripts_var / "log")] == [0o700] * 3


def _open_to_others(var: Path) -> list[str]:
    """Files and folders under `var` that other users could read, write or
    enter. Static files are left out: Django writes them 0644 and the portal
    serves them to anyone anyway (their folders are still checked)."""
    found = []
    for path in [var, *var.rglob("*")]:
        info = path.lstat()
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            continue  # PostgreSQL's socket, in its own 0700 folder
        if stat.S_ISREG(info.st_mode) and "staticfiles" in path.relative_to(var).parts:
            continue
        if info.st_mode & 0o007:
            found.append(f"{stat.S_IMODE(info.st_mode):o} {path.relative_to(var)}")
    return found


def test_the_scripts_processes_make_their_files_private(tmp_path):
    """scripts/run for real, in a var/ of its own (SQLite, Redis, a node
    agent and gunicorn; about 10 s): what its processes make, while running
    and once stopped (Redis writes its dump then), is closed to others."""
    var = tmp_path / "var"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PORTAL_VAR_DIR": str(var),
           "PORTAL_PORT": str(free_port()), "PORTAL_REDIS_PORT": str(free_port()), "PORTAL_NODE_NAME": f"umask-{RUN_ID}",
           # Its own instance: the agent never touches the containers of the tests' cluster.
           "PAI_INSTANCE": f"umask-{RUN_ID}",
           "PORTAL_NODE_ARGS": f"--ports {PORT_BASE + 560}-{PORT_BASE + 564} --cpus 1 --memory-mb 1024"}
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    output = tmp_path / "run.out"
    with open(output, "wb") as out:
        run = subprocess.Popen([str(ROOT / "scripts" / "run")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        def up() -> bool:
            assert run.poll() is None, f"scripts/run exited:\n{output.read_text()}"
            return "The portal is up" in output.read_text()

        wait_for(up, timeout=180, interval=0.2, what="scripts/run to start the portal")
        running = _open_to_others(var)
        logs = {p.name for p in (var / "log").iterdir()}
        assert {"redis.log", "gunicorn.log", "node-agent.log"} <= logs
        assert (var / "portal.sqlite3").is_file()
    finally:
        subprocess.run([str(ROOT / "scripts" / "stop")], cwd=ROOT, env=env, timeout=90, capture_output=True)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, 15)  # our own process group (start_new_session), never a name
            run.wait(timeout=30)
    assert running == []
    assert (var / "redis.rdb").is_file()  # Redis saved on its way out
    assert _open_to_others(var) == []


def test_it_stores_users_files_for_the_portals_user_only(tmp_path):
    local = LocalBackend(tmp_path / "root")
    local.write("/alice/notes/a.txt", io.BytesIO(b"private"))
    assert _mode(tmp_path / "root" / "alice" / "notes" / "a.txt") == 0o640
    assert _mode(tmp_path / "root" / "alice" / "notes") == 0o750


def test_it_keeps_staged_code_readable_inside_containers(alice, tmp_path):
    storage.backend().write(f"/{alice.username}/code/run.sh", io.BytesIO(b"echo hi\n"), overwrite=True)
    old = os.umask(0o077)  # the strictest umask a node could run with
    try:
        folder, _size = CodeStager().stage(tmp_path / "stage", f"file:///{alice.username}/code")
    finally:
        os.umask(old)
    assert _mode(Path(folder)) == 0o755 and _mode(Path(folder) / "run.sh") == 0o644


def _public_line(private_pem: str) -> str:
    key = serialization.load_ssh_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


@pytest.fixture
def held(alice) -> str:
    """Where alice's jobs wait: no node of the session's cluster launches
    them (and makes their key pair) while a test sets or reads their keys."""
    return hold_vc(f"held_{alice.username}", alice).name


def test_a_job_gets_its_key_pair_at_its_first_launch_once_whoever_launches_it(alice, held):
    job = submit(alice, config("waits", role(command="true"), virtualCluster=held))
    stored = Job.objects.filter(pk=job.pk).values_list("ssh_private_key", "ssh_public_key").get()
    assert stored == ("", "")  # a waiting job holds no private key
    first, second = Job.objects.get(pk=job.pk), Job.objects.get(pk=job.pk)  # two nodes launching two tasks
    ensure_job_key_pair(first)
    ensure_job_key_pair(second)  # read before the first stored its pair: takes that pair, makes none of its own
    stored = Job.objects.filter(pk=job.pk).values_list("ssh_private_key", "ssh_public_key").get()
    assert stored == (first.ssh_private_key, first.ssh_public_key) == (second.ssh_private_key, second.ssh_public_key)
    assert first.ssh_public_key.startswith("ssh-ed25519 ") and first.ssh_public_key.endswith(f" pai-job-{alice.username}-waits")
    assert first.ssh_public_key.startswith(_public_line(keys.open_private_key(first.ssh_private_key)))
    ensure_job_key_pair(first)  # a retry's launch keeps the pair
    assert Job.objects.filter(pk=job.pk).values_list("ssh_public_key", flat=True).get() == first.ssh_public_key


def test_it_seals_job_private_keys_and_the_owner_still_downloads_a_working_key(alice, bob):
    job = submit(alice, config("sealed", role(command="true")))
    ensure_job_key_pair(job)  # as its first task's launch does
    stored = Job.objects.filter(pk=job.pk).values_list("ssh_private_key", flat=True).get()
    assert stored.startswith(keys.SEALED_PREFIX)
    assert "PRIVATE KEY" not in stored and "-----BEGIN" not in stored

    owner = Client()
    owner.force_login(alice)
    page = owner.get(f"/jobs/{job.pk}/ssh-key/")
    assert page.status_code == 200
    api_url = f"/api/v1/user/{alice.username}/jobs/sealed/ssh/key"
    alice_token = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    api = Client().get(api_url, HTTP_AUTHORIZATION=f"Bearer {alice_token}")
    assert api.status_code == 200
    for served in (page.content.decode(), api.content.decode()):
        assert served.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert job.ssh_public_key.startswith(_public_line(served))  # the pair of the key tasks trust

    stranger = Client()
    stranger.force_login(bob)
    assert stranger.get(f"/jobs/{job.pk}/ssh-key/").status_code == 404
    bob_token = tokens.token_create(user=bob, lifetime=timedelta(hours=1)).key
    assert Client().get(api_url, HTTP_AUTHORIZATION=f"Bearer {bob_token}").status_code == 404
    anonymous = Client().get(f"/jobs/{job.pk}/ssh-key/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert Client().get(api_url).status_code == 401


def test_it_opens_keys_sealed_before_a_rotation_and_plaintext_rows_from_before(settings):
    pem, _public = keys.new_key_pair("old")
    sealed = keys.seal_private_key(pem)
    old_secret = settings.SECRET_KEY
    settings.SECRET_KEY = "a-new-secret-key-" + "y" * 50
    settings.SECRET_KEY_FALLBACKS = [old_secret]
    assert keys.open_private_key(sealed) == pem
    resealed = keys.seal_private_key(pem)
    settings.SECRET_KEY_FALLBACKS = []
    assert keys.open_private_key(resealed) == pem
    with pytest.raises(keys.SealedKeyUnreadable, match="PORTAL_SECRET_KEY_FALLBACKS"):
        keys.open_private_key(sealed)
    assert keys.open_private_key(pem) == pem  # a row stored before keys were sealed
    assert keys.open_private_key("") == ""


def test_reseal_secrets_seals_plaintext_rows_and_rows_of_an_old_key(settings, alice, held):
    """Rows stored before sealing stayed plain text, and a rotation left rows
    that open only with a fallback key: `manage.py reseal_secrets` seals
    them all under the current key, so the fallback can be dropped."""
    from django.core.management import CommandError, call_command

    plain_pem, plain_public = keys.new_key_pair("plain")
    old_pem, old_public = keys.new_key_pair("old")
    plain = submit(alice, config("plain-key", role(command="true"), virtualCluster=held))
    old = submit(alice, config("old-key", role(command="true"), virtualCluster=held))
    sealed_under_old = keys.seal_private_key(old_pem)
    # Whole pairs, as rows stored before sealing or before a rotation hold.
    Job.objects.filter(pk=plain.pk).update(ssh_private_key=plain_pem, ssh_public_key=plain_public,
                                           secrets_sealed='{"token": "s3"}')
    Job.objects.filter(pk=old.pk).update(ssh_private_key=sealed_under_old, ssh_public_key=old_public)
    old_secret = settings.SECRET_KEY
    settings.SECRET_KEY = "the-rotated-secret-key-" + "z" * 50
    settings.SECRET_KEY_FALLBACKS = [old_secret]

    call_command("reseal_secrets", verbosity=0)
    settings.SECRET_KEY_FALLBACKS = []  # the old key dropped, as the command's help says
    plain.refresh_from_db()
    old.refresh_from_db()
    assert plain.ssh_private_key.startswith(keys.SEALED_PREFIX) and keys.open_private_key(plain.ssh_private_key) == plain_pem
    assert keys.open_secrets(plain.secrets_sealed) == {"token": "s3"}
    assert keys.open_private_key(old.ssh_private_key) == old_pem
    assert keys.resealed(old.ssh_private_key) is None  # a second run changes nothing

    # A value no key opens is reported, named, and left as it was.
    Job.objects.filter(pk=old.pk).update(ssh_private_key=sealed_under_old)
    with pytest.raises(CommandError, match="PORTAL_SECRET_KEY_FALLBACKS"):
        call_command("reseal_secrets", verbosity=0, stderr=io.StringIO())
    old.refresh_from_db()
    assert old.ssh_private_key == sealed_under_old

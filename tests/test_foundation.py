"""The foundation: login, the pages behind it, usernames, the admin account,
and a smoke test of the Docker engine through the SDK with the local image."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client

from jobs.models import User, VirtualCluster
from tests.services import BUSYBOX_IMAGE


def test_it_serves_the_login_page_to_strangers(client):
    response = client.get("/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content and b'name="password"' in response.content


@pytest.mark.parametrize("path", ["/", "/submit/", "/virtual-clusters/", "/storage/", "/profile/", "/jobs/1/"])
def test_it_sends_strangers_to_the_login_page(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith(f"/login/?next={path}")


def test_it_logs_a_user_in_and_lands_on_the_job_list(client, alice):
    response = client.post("/login/", {"username": alice.username, "password": alice.test_password})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_refuses_a_wrong_password_without_saying_which_part_was_wrong(client, alice):
    response = client.post("/login/", {"username": alice.username, "password": "not-it"})
    assert response.status_code == 200
    assert b"didn&#x27;t match" in response.content or b"didn't match" in response.content
    assert "_auth_user_id" not in client.session


def test_it_logs_out_with_a_post(client, alice):
    client.force_login(alice)
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("name", ["with space", "dash-name", "dot.name", "ünïcode", "semi;colon"])
def test_it_refuses_usernames_outside_openpais_rule(name):
    user = User(username=name)
    user.set_password("pw-for-tests-1")
    with pytest.raises(ValidationError) as caught:
        user.full_clean()
    assert "username" in caught.value.message_dict


def test_it_accepts_letters_digits_and_underscores():
    user = User(username="Alice_01")
    user.set_password("pw-for-tests-1")
    user.full_clean()


def test_it_creates_the_admin_once_and_keeps_its_password(monkeypatch, capsys):
    monkeypatch.setenv("PORTAL_ADMIN_USER", "boss_for_test")
    monkeypatch.setenv("PORTAL_ADMIN_PASSWORD", "an-admin-password-1")
    call_command("ensure_admin")
    assert "boss_for_test / an-admin-password-1" in capsys.readouterr().out
    call_command("ensure_admin")  # a second run changes nothing and prints no password
    out = capsys.readouterr().out
    assert "an-admin-password-1" not in out and "boss_for_test" in out
    admin = User.objects.get(username="boss_for_test")
    assert admin.is_superuser and admin.check_password("an-admin-password-1")
    client = Client()
    assert client.login(username="boss_for_test", password="an-admin-password-1")
    assert client.get("/admin/").status_code == 200


def test_the_default_virtual_cluster_always_exists():
    call_command("ensure_defaults", verbosity=0)
    assert VirtualCluster.objects.get(name="default").open_to_all


def test_admins_manage_every_model_in_the_django_admin(admin_user):
    client = Client()
    client.force_login(admin_user)
    for model in ("user", "virtualcluster", "node", "job", "taskattempt"):
        assert client.get(f"/admin/jobs/{model}/").status_code == 200, model


@pytest.mark.services
def test_it_runs_a_container_from_the_local_busybox_image_through_the_sdk(docker_engine):
    import docker

    client = docker.from_env()
    output = client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", "echo smoke $((6*7))"], remove=True,
                                   network_disabled=True)
    assert output == b"smoke 42\n"


def test_admins_create_users_from_the_command_line(tmp_path, capsys):
    VirtualCluster.objects.get_or_create(name="cli_vc")
    secret = tmp_path / "pw"
    secret.write_text("a-good-password-77\n")
    call_command("createuser", "cli_user", "--password-file", str(secret), "--vc", "cli_vc")
    user = User.objects.get(username="cli_user")
    assert user.check_password("a-good-password-77") and not user.is_admin
    assert VirtualCluster.objects.get(name="cli_vc").allows(user)
    call_command("createuser", "cli_admin", "--admin", "--generate-password")
    assert "created admin cli_admin with password " in capsys.readouterr().out
    assert User.objects.get(username="cli_admin").is_admin


@pytest.mark.parametrize("args,message", [
    (["bad name", "--generate-password"], "letters, digits and underscores"),
    (["cli_dup", "--generate-password", "--vc", "nope"], "no virtual cluster named nope"),
])
def test_it_refuses_bad_command_line_users_saying_why(args, message):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=message):
        call_command("createuser", *args)

"""Interactive access for real: SSH with OpenSSH's client into a task of the
local Debian image (with the key downloaded from the portal, or the user's
own), tasks reaching each other by name, Jupyter served from a task and
opened from the job page, the browser terminal's WebSocket and who may open
it, and the profile's SSH keys."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from jobs import keys, services
from jobs.models import SshKey, State, TaskAttempt, TerminalSession
from jobs.services import access, webports
from tests.cluster import wait_for
from tests.task_hosts import TaskHostClient, follow_to_task_host
from tests.helpers import (
    DEBIAN_IMAGE, config, csrf_token, example, lines, login, new_user, role, running_attempt, running_job_of, submit,
    wait_state,
)

JUPYTER_PORT = [{"label": "jupyter", "beginAt": 0, "portNumber": 1}]
NODE_ADDRESS = "127.0.0.2"  # the test cluster's nodes (tests/cluster.py): not the portal's 127.0.0.1


# ------------------------------------------------------------------ helpers

class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append({k: v or "" for k, v in attrs})


def links_with_class(html: str, css_class: str) -> list[str]:
    parser = _Anchors()
    parser.feed(html)
    return [a["href"] for a in parser.anchors if css_class in a.get("class", "").split()]


def text_of(html: str) -> str:
    """The page's text with tags dropped and entities decoded, spaces folded."""
    from html import unescape

    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def ssh(key: Path, port: int, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
         f"root@{NODE_ADDRESS}", command],
        capture_output=True, text=True, timeout=60,
    )


def ssh_until_it_answers(key: Path, port: int, command: str) -> subprocess.CompletedProcess:
    """sshd starts beside the command: retry for the few moments it takes."""
    return wait_for(lambda: (r := ssh(key, port, command)).returncode == 0 and r, timeout=30, interval=0.3,
                    what="ssh to succeed")


def write_key(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def job_page(session: requests.Session, base_url: str, job) -> str:
    response = session.get(f"{base_url}/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.text


def terminal_socket(base_url: str, attempt_id: int, session: requests.Session | None):
    cookies = "; ".join(f"{c.name}={c.value}" for c in session.cookies) if session else ""
    headers = {"Cookie": cookies} if cookies else {}
    url = base_url.replace("http://", "ws://") + f"/ws/terminal/{attempt_id}/"
    return ws_connect(url, origin=base_url, additional_headers=headers, proxy=None, open_timeout=10)


def container_processes(attempt: TaskAttempt) -> str:
    return subprocess.run(["docker", "exec", attempt.container_id, "ps"], capture_output=True, text=True).stdout


def refusal(socket) -> tuple[str, int]:
    """(message, close code) of a terminal the portal refuses."""
    message = json.loads(socket.recv(timeout=10))
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(timeout=10)
    return message["message"], closed.value.rcvd.code


# ------------------------------------------------- the profile's SSH keys

def test_it_adds_lists_and_deletes_the_users_ssh_keys(alice_client, alice, bob):
    _private, public = keys.new_key_pair("alice@laptop")
    response = alice_client.post("/profile/ssh-keys/add/", {"title": "", "public_key": public + "\n"}, follow=True)
    key = SshKey.objects.get(user=alice)
    assert key.title == "alice@laptop" and key.public_key == public
    assert key.fingerprint.startswith("SHA256:")
    assert key.fingerprint in response.content.decode() and "Added SSH key" in response.content.decode()

    again = alice_client.post("/profile/ssh-keys/add/", {"title": "again", "public_key": public}, follow=True)
    assert 'you already added this key, as "alice@laptop"' in text_of(again.content.decode())
    assert SshKey.objects.filter(user=alice).count() == 1

    bobs = SshKey.objects.create(user=bob, title="bob's", public_key=keys.new_key_pair("b")[1], fingerprint="x")
    assert alice_client.post(f"/profile/ssh-keys/{bobs.pk}/delete/").status_code == 404
    assert alice_client.get(f"/profile/ssh-keys/{key.pk}/delete/").status_code == 405
    deleted = alice_client.post(f"/profile/ssh-keys/{key.pk}/delete/", follow=True)
    assert "Deleted the SSH key" in deleted.content.decode()
    assert not SshKey.objects.filter(user=alice).exists() and SshKey.objects.filter(pk=bobs.pk).exists()


def test_it_refuses_a_bad_public_key_naming_the_field_and_keeps_what_was_typed(alice_client, alice):
    pasted = "ssh-ed25519 not-base64!! me@host"
    page = alice_client.post("/profile/ssh-keys/add/", {"title": "work", "public_key": pasted}, follow=True)
    text = text_of(page.content.decode())
    assert page.status_code == 200
    assert "The SSH key was not added: public key: the key data is not valid base64" in text
    assert pasted in text and 'value="work"' in page.content.decode()  # the form still holds the input
    private, _public = keys.new_key_pair("oops")
    page = alice_client.post("/profile/ssh-keys/add/", {"title": "x", "public_key": private}, follow=True)
    assert "this is a private key: paste the public key (the .pub file) instead" in text_of(page.content.decode())
    page = alice_client.post("/profile/ssh-keys/add/", {"title": "x", "public_key": "ssh-ed25519"}, follow=True)
    assert "expected one line like 'ssh-ed25519 AAAA... you@laptop'" in text_of(page.content.decode())
    assert not SshKey.objects.filter(user=alice).exists()


def test_it_needs_a_login_for_keys_and_terminals():
    client = Client()
    for url in ("/profile/ssh-keys/add/", "/jobs/1/ssh-key/", "/jobs/1/terminal/1/"):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


# ------------------------------------------------------- SSH into a task

@pytest.mark.services
def test_it_lets_the_owner_ssh_in_with_the_downloaded_key_and_no_one_else(alice, bob, cluster, tmp_path):
    base = cluster.base_url
    owner = login(base, alice)
    # Alice's own key, added on her profile before she submits.
    own_private, own_public = keys.new_key_pair("alice@laptop")
    profile = owner.get(f"{base}/profile/").text
    added = owner.post(f"{base}/profile/ssh-keys/add/", data={"title": "laptop", "public_key": own_public,
                                                             "csrfmiddlewaretoken": csrf_token(profile)},
                       headers={"Referer": f"{base}/profile/"})
    assert added.ok and SshKey.objects.filter(user=alice, title="laptop").exists()

    job = submit(alice, config("sshjob", role(command="echo user command runs; sleep 600"), image=DEBIAN_IMAGE))
    attempt = running_attempt(job)
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).ssh_available is True, what="sshd to be found")
    attempt.refresh_from_db()
    port = attempt.ports["ssh"][0]

    # The page shows the command to copy, and the key's download link.
    page = job_page(owner, base, job)
    command = f"ssh -p {port} root@{NODE_ADDRESS} -i sshjob.key"
    assert f'data-copy="{command}"' in page
    download = links_with_class(page, "ssh-key-link")
    assert download and download[0] == f"/jobs/{job.pk}/ssh-key/"
    response = owner.get(base + download[0])
    assert response.status_code == 200 and "OPENSSH PRIVATE KEY" in response.text
    assert response.headers["Content-Disposition"] == 'attachment; filename="sshjob.key"'
    key = write_key(tmp_path / "sshjob.key", response.text)

    result = ssh_until_it_answers(key, port, "hostname; bash -lc 'echo $PAI_JOB_NAME'")
    assert result.stdout.splitlines() == ["main-0", "sshjob"]  # login shells see the task's variables
    assert ssh(write_key(tmp_path / "own", own_private), port, "echo mine").stdout.strip() == "mine"
    wait_for(lambda: lines(job) == ["user command runs"], what="the command's output")  # it runs as before
    assert TaskAttempt.objects.get(pk=attempt.pk).state == "RUNNING"

    stranger = login(base, bob)
    assert stranger.get(f"{base}/jobs/{job.pk}/ssh-key/").status_code == 404
    assert stranger.get(f"{base}/jobs/{job.pk}/").status_code == 404
    anonymous = requests.get(f"{base}/jobs/{job.pk}/ssh-key/", allow_redirects=False)
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
    other_private, _other_public = keys.new_key_pair("bob")
    refused = ssh(write_key(tmp_path / "other.key", other_private), port, "true")
    assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_it_authorizes_the_key_a_v2_jobs_ssh_plugin_names(alice, cluster, tmp_path):
    private, public = keys.new_key_pair("plugin@laptop")
    text = "\n".join([
        "protocolVersion: 2", "name: pluginssh", "type: job",
        "prerequisites:", f"  - {{name: img, type: dockerimage, uri: '{DEBIAN_IMAGE}'}}",
        "taskRoles:", "  main:", "    dockerImage: img",
        "    resourcePerInstance: {cpu: 1, memoryMB: 512, gpu: 0}", "    commands: ['sleep 600']",
        "extras:", "  com.microsoft.pai.runtimeplugin:", "    - plugin: ssh",
        "      parameters: {jobssh: true, userssh: {type: custom, value: '" + public + "'}}", "",
    ])
    job = services.job_submit(owner=alice, config=text)
    attempt = running_attempt(job)
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).ssh_available is True, what="sshd to be found")
    port = TaskAttempt.objects.get(pk=attempt.pk).ports["ssh"][0]
    assert ssh_until_it_answers(write_key(tmp_path / "plugin.key", private), port, "hostname").stdout.strip() == "main-0"
    services.job_stop(job=job, by=alice)


@pytest.mark.services
def test_it_lets_tasks_reach_each_other_by_role_and_index_over_ssh(alice, cluster):
    command = ("if [ $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX = 0 ]; then "
               "for i in $(seq 60); do ssh worker-1 hostname && exit 0; sleep 0.5; done; exit 1; "
               "else sleep 600; fi")
    job = submit(alice, config("mpi", role("worker", command, tasks=2, minSucceededTaskCount=1), image=DEBIAN_IMAGE))
    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=90)
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert "worker-1" in lines(job, role="worker", index=0)


# ------------------------------------ a busybox task: no sshd, a terminal

@pytest.fixture(scope="module")
def busybox_task(cluster):
    """A running busybox task (busybox has no SSH server) of a user of its
    own, shared by the tests below."""
    owner = new_user("carol")
    with running_job_of(owner, config("nossh", role(command="sleep 600"))) as (job, attempt):
        yield owner, job, attempt


@pytest.mark.services
def test_it_says_plainly_when_an_image_has_no_ssh_server(busybox_task, cluster):
    owner, job, attempt = busybox_task
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).ssh_available is False, what="the ssh probe")
    page = job_page(login(cluster.base_url, owner), cluster.base_url, job)
    assert "This image has no SSH server (/usr/sbin/sshd), so SSH is not available" in text_of(page)
    assert "ssh -p" not in page and not links_with_class(page, "ssh-key-link")
    assert links_with_class(page, "terminal-link") == [f"/jobs/{job.pk}/terminal/{attempt.pk}/"]


@pytest.mark.services
def test_it_keeps_the_terminal_to_the_owner_and_records_each_session(busybox_task, cluster, bob, admin_user):
    owner, job, attempt = busybox_task
    base = cluster.base_url
    with terminal_socket(base, attempt.pk, None) as anonymous:
        assert refusal(anonymous)[1] == 4403
    with terminal_socket(base, attempt.pk, login(base, bob)) as stranger:
        assert refusal(stranger) == ("no such task, or it is not yours", 4403)
    assert login(base, bob).get(f"{base}/jobs/{job.pk}/terminal/{attempt.pk}/").status_code == 404

    with terminal_socket(base, attempt.pk, login(base, owner)) as shell:
        shell.send(json.dumps({"type": "resize", "rows": 30, "cols": 100}))
        shell.send(json.dumps({"type": "input", "data": "stty size; echo $PAI_JOB_NAME-$((6*7))\r"}))
        seen = b""
        while b"nossh-42" not in seen or b"30 100" not in seen:
            seen += shell.recv(timeout=10)
        assert b"pai-terminal-pid" not in seen
    session = wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, user=owner, ended_at__isnull=False).first(),
                       what="the session to be recorded as closed")
    assert session.end_reason == "closed by the browser" and session.client_address == "127.0.0.1"
    # The shell was hung up, not left behind in the container.
    wait_for(lambda: "sh -l" not in container_processes(attempt), timeout=10, what="the shell to end")

    with terminal_socket(base, attempt.pk, login(base, admin_user)) as admin_shell:
        admin_shell.send(json.dumps({"type": "input", "data": "exit\r"}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                admin_shell.recv(timeout=10)
        assert closed.value.rcvd.code == 1000
    wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, user=admin_user, end_reason="the shell exited").exists(),
             what="the admin's session to be recorded as closed")
    assert not TerminalSession.objects.filter(attempt=attempt, user=bob).exists()
    # Admins read the audit log in the Django admin; nobody edits it.
    admin_client = Client()
    admin_client.force_login(admin_user)
    audit = admin_client.get("/admin/jobs/terminalsession/").content.decode()
    assert owner.username in audit and "closed by the browser" in audit and "the shell exited" in audit
    assert admin_client.get("/admin/jobs/terminalsession/add/").status_code == 403


@pytest.mark.services
def test_it_closes_the_terminal_when_the_task_ends(alice, cluster):
    job = submit(alice, config("ends", role(command="sleep 600")))
    attempt = running_attempt(job)
    with terminal_socket(cluster.base_url, attempt.pk, login(cluster.base_url, alice)) as shell:
        shell.send(json.dumps({"type": "input", "data": "echo ready\r"}))
        seen = b""
        while b"ready\r\n" not in seen:
            seen += shell.recv(timeout=10)
        services.job_stop(job=job, by=alice)
        assert refusal_after_output(shell) == ("the task has ended", 4410)
    wait_for(lambda: TerminalSession.objects.get(attempt=attempt).end_reason == "the task ended",
             what="the session to be recorded as ended with the task")
    with terminal_socket(cluster.base_url, attempt.pk, login(cluster.base_url, alice)) as late:
        assert refusal(late) == ("the task is not running", 4409)


def refusal_after_output(socket) -> tuple[str, int]:
    """Skip terminal output until the portal's closing message."""
    while True:
        frame = socket.recv(timeout=20)
        if isinstance(frame, str):
            message = json.loads(frame)["message"]
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    socket.recv(timeout=10)
            return message, closed.value.rcvd.code


# ------------------------------------------------------------ Jupyter

def test_it_reads_the_token_a_command_gives_jupyter():
    example_command = example("jupyter-notebook.json")["taskRoles"][0]["command"]
    assert access.token_in_command(example_command) == '""'
    assert access.token_in_command("jupyter lab --ServerApp.token='s3cret word' --port=1") == "s3cret word"
    assert access.token_in_command("jupyter notebook --NotebookApp.token abc") == "abc"
    assert access.token_in_command("jupyter notebook --NotebookApp.token=") == ""
    assert access.token_in_command("jupyter notebook --port=8888") is None
    assert access.token_in_command("echo 'unbalanced") is None


@pytest.mark.parametrize("command", ["jupyter notebook --NotebookApp.token=<% $secrets.nbtoken %>",
                                     "jupyter lab --ServerApp.token=$NB_TOKEN", 'jupyter lab --ServerApp.token "${T}"'])
def test_a_token_set_from_a_variable_or_a_secret_is_not_known(command):
    # The page cannot know what the shell or the portal puts there: "<%" or
    # "$NB_TOKEN" in the Open Jupyter link (said to carry the token) failed.
    assert access.known_token(access.token_in_command(command)) is None
    assert access.known_token("abc") == "abc" and access.known_token(None) is None


def jupyter_home(client: TaskHostClient, path: str) -> requests.Response:
    """Jupyter's answer through the proxy, once the server listens."""
    return wait_for(lambda: (r := client.follow(path)).status_code == 200 and r, timeout=90, what="Jupyter to answer")


@pytest.mark.services
def test_it_serves_jupyter_from_a_task_through_the_portal_and_opens_it_from_the_job_page(alice, cluster):
    base = cluster.base_url
    # The reference example (no token), and the same server left to make a token.
    plain = submit(alice, example("jupyter-notebook.json", jobName="notebook", image=DEBIAN_IMAGE))
    tokened_role = role("task_1", "jupyter notebook --allow-root --no-browser --ip 0.0.0.0 "
                                  "--port=$PAI_CONTAINER_HOST_jupyter_PORT_LIST", portList=JUPYTER_PORT)
    tokened = submit(alice, config("notebook_token", tokened_role, image=DEBIAN_IMAGE))
    owner = login(base, alice)

    attempt = running_attempt(plain, timeout=90)
    page = job_page(owner, base, plain)
    port = attempt.ports["jupyter"][0]
    proxy_link = f"/jobs/{plain.pk}/tasks/{attempt.pk}/ports/{port}/"
    assert f'href="{proxy_link}"' in page  # the ports column links the web port, through the portal
    assert f"{NODE_ADDRESS}:{port}" not in page  # published on the node's loopback only
    url = wait_for(lambda: links_with_class(job_page(owner, base, plain), "jupyter-link"), what="the Jupyter link")[0]
    # The example sets the token to "" (two quote characters, as the shell
    # passes them); the link carries it, so the click lands in the notebook.
    # The portal signs the path it chose, so the link goes straight on (finding 43).
    signature = webports.landing_signature(attempt_id=attempt.pk, port=port, path='/?token=%22%22')
    assert unescape(url) == proxy_link + f"?next=%2F%3Ftoken%3D%2522%2522&landing={signature}"
    client, landing = follow_to_task_host(owner, base, unescape(url))
    assert landing == "/?token=%22%22"
    response = jupyter_home(client, landing)
    assert "<title>Home Page - Select or create a notebook</title>" in response.text  # the notebook's file tree

    attempt = running_attempt(tokened, timeout=90)
    found = wait_for(lambda: access.jupyter_token(tokened, attempt), timeout=90, what="Jupyter to print its token")
    url = links_with_class(job_page(owner, base, tokened), "jupyter-link")[0]
    client, landing = follow_to_task_host(owner, base, unescape(url))
    assert landing == f"/?token={found}"
    assert "<title>Home Page - Select or create a notebook</title>" in jupyter_home(client, landing).text
    without_token = TaskHostClient(client.base_url, client.host, client.cookie).get("/tree")  # not Jupyter's cookie
    assert without_token.status_code == 302 and "/login" in without_token.headers["Location"]  # the token let us in


# Start a kernel and run 6*7 over its WebSocket, as the notebook page does.
RUN_IN_A_KERNEL = """async () => {
  const xsrf = decodeURIComponent((document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "");
  const made = await fetch("/api/kernels", {method: "POST", body: "{}",
                                            headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"}});
  if (!made.ok) return "kernel " + made.status;
  const kernel = await made.json();
  return await new Promise((resolve) => {
    const ws = new WebSocket(`ws://${location.host}/api/kernels/${kernel.id}/channels?session_id=s1`);
    const timer = setTimeout(() => resolve("timeout"), 60000);
    ws.onopen = () => ws.send(JSON.stringify({
      header: {msg_id: "m1", username: "t", session: "s1", msg_type: "execute_request", version: "5.3",
               date: new Date().toISOString()},
      parent_header: {}, metadata: {}, channel: "shell", buffers: [],
      content: {code: "6*7", silent: false, store_history: false, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
    ws.onmessage = (e) => { const m = JSON.parse(e.data);
      if (m.msg_type === "execute_result") { clearTimeout(timer); resolve(m.content.data["text/plain"]); } };
    ws.onclose = (e) => { clearTimeout(timer); resolve("closed " + e.code); };
  });
}"""


@pytest.mark.services
@pytest.mark.browser
def test_it_opens_jupyter_from_the_job_page_in_a_browser_and_runs_a_kernel_through_the_portal(page, alice, cluster):
    from tests.browser import login as browser_login, screenshot

    job = submit(alice, example("jupyter-notebook.json", jobName="notebook_browser", image=DEBIAN_IMAGE))
    attempt = running_attempt(job, timeout=90)
    port = attempt.ports["jupyter"][0]
    owner = login(cluster.base_url, alice)
    url = wait_for(lambda: links_with_class(job_page(owner, cluster.base_url, job), "jupyter-link"), what="the link")[0]
    client, landing = follow_to_task_host(owner, cluster.base_url, url)
    jupyter_home(client, landing)  # the server listens: the click below lands in it

    browser_login(page, alice)
    page.goto(f"/jobs/{job.pk}/")
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="Open Jupyter").click()
    notebook = opened.value
    notebook.wait_for_load_state()
    assert notebook.title() == "Home Page - Select or create a notebook"
    portal_port = cluster.base_url.rsplit(":", 1)[1]
    assert notebook.url == f"http://t{attempt.pk}-{port}.localhost:{portal_port}/tree"
    assert "sessionid" not in notebook.evaluate("document.cookie")  # the portal's cookies stay with the portal
    screenshot(notebook, "jupyter-through-the-portal")
    assert notebook.evaluate(RUN_IN_A_KERNEL) == "42"


@pytest.mark.services
def test_it_shows_an_idle_notice_on_a_quiet_jupyter_task(alice, cluster):
    job = submit(alice, config("quiet", role(command="sleep 600", portList=JUPYTER_PORT)))
    attempt = running_attempt(job)
    owner = login(cluster.base_url, alice)
    assert "Idle for" not in job_page(owner, cluster.base_url, job)
    # Let time pass: the task started, and last printed, two hours ago.
    two_hours_ago = timezone.now() - timedelta(hours=2)
    TaskAttempt.objects.filter(pk=attempt.pk).update(started_at=two_hours_ago, last_activity_at=two_hours_ago)
    assert "Idle for 120 minutes" in text_of(job_page(owner, cluster.base_url, job))

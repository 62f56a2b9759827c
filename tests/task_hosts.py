"""Helpers for tests of tasks' web ports: a small HTTP app a task runs (it
shows what it was sent), and a client that goes through the portal's proxy
the way a browser does (the portal's link, the ticket, the proxy's cookie).

The proxy's host names (t<attempt>-<port>.localhost) need no resolver: the
client connects to the portal's own address and sends the Host header.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from tests.helpers import csrf_token

# A task's app: / is a page showing the Cookie header it got and opening the
# WebSocket named in ?ws= (what a malicious job would try); /echo answers
# the request's headers (and body length) as JSON; /stream sends one line,
# then holds the rest of the response for a minute.
_APP = r'''
import base64, hashlib, html, http.server, json, sys, time
PAGE = """<!doctype html><title>job app</title><pre id="cookie">%s</pre><p id="ws">waiting</p><script>
const url = new URLSearchParams(location.search).get("ws"); const out = document.getElementById("ws");
if (url) { const ws = new WebSocket(url); let seen = "";
  ws.onopen = () => { seen += "open "; out.textContent = seen; };
  ws.onmessage = (e) => { seen += "message "; out.textContent = seen; };
  ws.onclose = (e) => { seen += "closed " + e.code; out.textContent = seen; }; }
else { out.textContent = "no socket"; }
</script>"""
class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def reply(self, body, kind):
        self.send_response(200); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":  # says "hello", then waits for the client to go
            digest = hashlib.sha1((self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode())
            self.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              "Sec-WebSocket-Accept: " + base64.b64encode(digest.digest()).decode() + "\r\n\r\n").encode())
            self.wfile.write(b"\x81\x05hello"); self.wfile.flush(); self.rfile.read(1)
            self.close_connection = True
        elif self.path.startswith("/echo"):
            seen = {"path": self.path, "headers": [[k.lower(), v] for k, v in self.headers.items()]}
            self.reply(json.dumps(seen).encode(), "application/json")
        elif self.path == "/stream":
            self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
            self.wfile.write(b"first line\n"); self.wfile.flush(); time.sleep(60); self.wfile.write(b"last line\n")
        else:
            self.reply((PAGE % html.escape(self.headers.get("Cookie") or "(no cookie)")).encode(), "text/html")
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0); got = 0
        while got < length:
            got += len(self.rfile.read(min(65536, length - got)))
        self.reply(json.dumps({"received": got}).encode(), "application/json")
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), App).serve_forever()
'''


def app_command(label: str) -> str:
    """The shell command that runs the app on the task's first `label` port."""
    encoded = base64.b64encode(_APP.encode()).decode()
    return f"echo {encoded} | base64 -d > /tmp/app.py && exec python3 /tmp/app.py $PAI_CONTAINER_HOST_{label}_PORT_LIST"


def port_spec(label: str) -> list[dict]:
    return [{"label": label, "beginAt": 0, "portNumber": 1}]


def forwarder_answer(sock: Any) -> bytes:
    """A node forwarder's answer line to a proof ("OK\\n" or "NO ...\\n"),
    read a byte at a time so nothing after it is taken; short if it closed."""
    answer = b""
    while not answer.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            break
        answer += byte
    return answer


@contextmanager
def portal_in_thread() -> Iterator[str]:
    """portal.asgi's application under uvicorn with the gunicorn worker's
    settings, in a thread of this process (so a test's settings are the
    portal's, HTTPS among them); its base URL."""
    import socket
    import threading

    import uvicorn

    from portal.asgi import application
    from portal.workers import PortalWorker
    from tests.cluster import wait_for

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    kwargs = {k: v for k, v in PortalWorker.CONFIG_KWARGS.items() if k != "loop"}
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning", **kwargs))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def running_app(name: str, label: str = "http", *, gpu_type: str = "") -> Iterator[tuple[Any, Any]]:
    """(owner, task attempt): a user of its own (its password as
    `test_password`) whose one-task job `name` serves the app on its first
    `label` port in the Debian image (on a node of `gpu_type`, with one GPU,
    if given); the job is stopped afterwards."""
    from tests.cluster import wait_for
    from tests.helpers import DEBIAN_IMAGE, config, lines, new_user, role, running_job_of

    owner = new_user(name)
    placement = {"gpuType": gpu_type} if gpu_type else {}
    task_role = role(command=app_command(label), portList=port_spec(label), gpus=1 if gpu_type else 0)
    with running_job_of(owner, config(name, task_role, image=DEBIAN_IMAGE, **placement), timeout=90) as (job, attempt):
        wait_for(lambda: lines(job) == ["serving"], timeout=60, what="the app to listen")
        yield owner, attempt


@dataclass
class TaskHostClient:
    """Requests to one task host through the portal's address."""

    base_url: str  # the portal's, e.g. http://127.0.0.1:8000
    host: str  # t5-20001.localhost:8000
    cookie: str = ""  # the proxy's cookie, "name=value"
    app_cookies: dict[str, str] = field(default_factory=dict)  # what the job's app set (kept with keep_cookies)

    def get(self, path: str, *, headers: dict[str, str] | None = None, **kwargs) -> requests.Response:
        return self.request("GET", path, headers=headers, **kwargs)

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None, keep_cookies: bool = False,
                **kwargs) -> requests.Response:
        sent = {"Host": self.host, **(headers or {})}
        jar = [self.cookie, *(f"{k}={v}" for k, v in self.app_cookies.items()), sent.get("Cookie", "")]
        if any(jar):
            sent["Cookie"] = "; ".join(filter(None, jar))
        kwargs.setdefault("allow_redirects", False)
        kwargs.setdefault("timeout", 30)
        response = requests.request(method, self.base_url + path, headers=sent, proxies={"http": "", "https": ""},
                                    **kwargs)
        if keep_cookies:
            self.app_cookies.update({c.name: c.value for c in response.cookies})
        return response

    def follow(self, path: str, *, hops: int = 5) -> requests.Response:
        """GET, following the app's redirects on this host, keeping its cookies."""
        response = self.get(path, keep_cookies=True)
        while response.is_redirect and hops:
            location = urlsplit(response.headers["Location"])
            assert location.netloc in ("", self.host), response.headers["Location"]
            response = self.get(location.path + (f"?{location.query}" if location.query else ""), keep_cookies=True)
            hops -= 1
        return response

    def ws_url(self, path: str) -> str:
        return self.base_url.replace("http://", "ws://") + path


@dataclass(frozen=True)
class EnterForm:
    """The portal's page that takes a browser into a task host: a form
    posting a one-time ticket there."""

    action: str  # http://t5-20001.localhost:8000/__pai_portal__/enter
    ticket: str


def enter_form(page: str) -> EnterForm:
    action = re.search(r'<form[^>]*id="web-port-enter"[^>]*action="([^"]+)"', page)
    ticket = re.search(r'name="ticket" value="([^"]+)"', page)
    assert action and ticket, page[:2000]
    return EnterForm(html.unescape(action.group(1)), html.unescape(ticket.group(1)))


def enter_page(session: requests.Session, base_url: str, link: str) -> requests.Response:
    """The portal's page with the enter form, past the notice an admin gets
    for another user's port, or anyone for a path the portal did not sign
    (a form of the portal's, confirmed as its button would)."""
    page = session.get(base_url + link, allow_redirects=False)
    assert page.status_code == 200, (page.status_code, page.text[:300])
    if 'id="web-port-enter"' not in page.text:
        landing = re.search(r'<input type="hidden" name="next" value="([^"]*)"', page.text)
        data = {"csrfmiddlewaretoken": csrf_token(page.text), "next": html.unescape(landing.group(1)) if landing else "/"}
        page = session.post(base_url + link, data=data,
                            headers={"Referer": base_url + link}, allow_redirects=False)
        assert page.status_code == 200, (page.status_code, page.text[:300])
    return page


def follow_to_task_host(session: requests.Session, base_url: str, link: str) -> tuple[TaskHostClient, str]:
    """Open the job page's link as a browser would: (a client signed in to
    the task host, the path the proxy sent us on to). The form is posted
    with the portal's page's Origin, as the browser sends it."""
    form = enter_form(enter_page(session, base_url, link).text)
    target = urlsplit(form.action)
    client = TaskHostClient(base_url, target.netloc)
    entered = client.request("POST", target.path, data=f"ticket={form.ticket}",
                             headers={"Origin": base_url, "Content-Type": "application/x-www-form-urlencoded"})
    assert entered.status_code == 303, (entered.status_code, entered.text)
    name, _, rest = entered.headers["Set-Cookie"].partition(";")
    client.cookie = name.strip()
    return client, entered.headers["Location"]

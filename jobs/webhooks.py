"""One webhook delivery: a signed JSON POST to a user's URL, only to an
address the portal allows, and nothing else.

A user's URL is the portal reaching out on their behalf, from inside the
cluster's network: without care it is a way to poke at the portal's Redis,
a node's Docker port or the cloud's metadata service (SSRF). So:

- the host is resolved once, every address it gave is checked against the
  allowed networks (`address_allowed`), and the connection goes to the
  address that passed: there is no second lookup that a DNS server could
  answer differently (DNS rebinding);
- the request is written here, on a plain socket, and only the status line
  is read back: no redirect is ever followed, and the whole exchange ends
  within one deadline however slowly the receiver trickles bytes;
- HTTPS checks the certificate against the URL's host name, as usual.

No Django here: settings come in as arguments (jobs/services/notifications.py).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from jobs.addresses import Address, is_public

# In an allowed-networks list: every globally routable address (not
# loopback, private, link-local with the metadata address, shared, reserved,
# multicast ...).
PUBLIC = "public"
SIGNATURE_HEADER = "X-Portal-Signature"
DELIVERY_HEADER = "X-Portal-Delivery"
TIMESTAMP_HEADER = "X-Portal-Timestamp"
SIGNATURE_VERSION = "v1"
MAX_URL_LENGTH = 2000
USER_AGENT = "gpu-job-portal-webhook/1"
_MAX_STATUS_BYTES = 8192
_MAX_INTERIM = 10  # interim (1xx) answers read past before the final one


def sign(*, delivery_id: str, timestamp: int, body: bytes, secret: str) -> str:
    """The signature header's value: "v1=" and the hex HMAC-SHA256, with the
    secret, of "<delivery id>.<timestamp>.<raw body>" (the Standard Webhooks
    scheme's signed content). The body alone would let a captured delivery
    be sent again, any time, under another delivery id, and pass a
    receiver that drops repeats by id (SECURITY.md, finding 29)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    return f"{SIGNATURE_VERSION}=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signed_headers(*, delivery_id: str, body: bytes, secret: str, now: float | None = None) -> dict[str, str]:
    """The headers that let a receiver check a delivery, signed at `now`
    (each try is signed when made: a retry hours later is still fresh)."""
    timestamp = int(time.time() if now is None else now)
    return {DELIVERY_HEADER: delivery_id, TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(delivery_id=delivery_id, timestamp=timestamp, body=body, secret=secret)}


# ------------------------------------------------------------------ addresses


def address_allowed(address: Address, networks: Sequence[str]) -> bool:
    """Whether a webhook may connect to `address`: it is in one of
    `networks` (CIDRs, or PUBLIC for any globally routable address)."""
    mapped = isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped
    plain = mapped or address
    for entry in networks:
        if entry == PUBLIC:
            if is_public(plain):
                return True
        elif plain in ipaddress.ip_network(entry, strict=False):
            return True
    return False


# ----------------------------------------------------------------------- URLs


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL, without brackets
    port: int
    path: str  # path and query, at least "/"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str) -> Target:
    """The parts of a webhook URL; ValueError says what is wrong with it."""
    if not url:
        raise ValueError("the URL is empty")
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise ValueError("the URL contains spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL must start with http:// or https://")
    if "@" in parts.netloc:
        raise ValueError("the URL must not contain a user name or password")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the URL's port is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError("the URL has no host")
    if port == 0:
        raise ValueError("the URL's port is not a number from 1 to 65535")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # The request goes out in ASCII: a domain name in its IDNA form, other
    # letters in the path and query percent-encoded as UTF-8.
    path = "".join(c if c.isascii() else quote(c) for c in path)
    return Target(parts.scheme, _ascii_host(parts.hostname), port or (443 if parts.scheme == "https" else 80), path)


_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)\Z")


def _ascii_host(host: str) -> str:
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("the URL's host is not a valid domain name") from None
    # A name no resolver could ever answer (a..b, a label over 63 letters)
    # is refused when saved, not tried and retried for hours.
    name = host.rstrip(".")
    if literal_address(host) is None and (len(name) > 253 or not all(_LABEL_RE.match(p) for p in name.split("."))):
        raise ValueError("the URL's host is not a valid domain name")
    return host


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class Refused(Exception):
    """The destination is outside the allowed networks: never tried again."""


class Unreachable(Exception):
    """The host could not be resolved or reached now: worth another try."""


def _lookup(target: Target, timeout: float) -> list:
    """getaddrinfo within `timeout`. It has no timeout of its own: a name
    server that never answers (the user's own, for their own domain) would
    hold the delivery for the resolver's every retry. The lookup is left to
    finish on its own daemon thread."""
    answer: dict[str, object] = {}

    def look() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            answer["error"] = exc

    thread = threading.Thread(target=look, name="webhook-lookup", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Unreachable(f"cannot resolve {target.host}: no answer within {timeout:g} s")
    if "error" in answer:
        raise Unreachable(f"cannot resolve {target.host}: {answer['error']}")
    return answer["infos"]  # type: ignore[return-value]


def resolve(target: Target, networks: Sequence[str], *, timeout: float = 30.0) -> Address:
    """The first of the host's addresses that is allowed; Refused naming
    them when none is."""
    literal = literal_address(target.host)
    if literal is not None:
        found = [literal]
    else:
        infos = _lookup(target, timeout)
        found = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))
    for address in found:
        if address_allowed(address, networks):
            return address
    shown = ", ".join(str(a) for a in found[:4])
    raise Refused(f"{target.host} is {shown}, outside the networks webhooks may reach (WEBHOOK_ALLOWED_NETWORKS)")


# ------------------------------------------------------------------ delivering


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    retry: bool  # a later try may go better (timeouts, 5xx, 429 ...)
    refused: bool = False  # the destination is not allowed
    status: int | None = None
    message: str = ""


def _request(target: Target, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}", f"User-Agent: {USER_AGENT}",
             "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"]
    for name, value in headers.items():
        if any(c in value for c in "\r\n") or any(c in name for c in "\r\n:"):
            raise ValueError(f"header {name!r} would break the request")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _status_line(sock: socket.socket, deadline: float) -> bytes:
    """The final answer's status line; only it matters to us. Interim
    answers (100 Continue, 103 Early Hints: 1xx but 101) come before it and
    are read past: a receiver sending one was judged by it, as refusing."""
    data = b""
    for _ in range(_MAX_INTERIM + 1):
        data = _read_until(sock, data, b"\r\n", deadline)
        line = data.split(b"\r\n", 1)[0]
        if not _is_interim(line):
            return line
        data = _read_until(sock, data, b"\r\n\r\n", deadline)
        if b"\r\n\r\n" not in data:
            break
        data = data.split(b"\r\n\r\n", 1)[1]
    return b""  # no final answer: not HTTP as we take it


def _read_until(sock: socket.socket, data: bytes, marker: bytes, deadline: float) -> bytes:
    while marker not in data and len(data) <= _MAX_STATUS_BYTES:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    return data


def _is_interim(line: bytes) -> bool:
    parts = line.split(b" ", 2)
    return (len(parts) >= 2 and parts[0].startswith(b"HTTP/") and len(parts[1]) == 3 and parts[1].isdigit()
            and parts[1][:1] == b"1" and parts[1] != b"101")


def _exchange(target: Target, address: Address, request: bytes, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    sock = socket.create_connection((str(address), target.port), timeout=timeout)
    try:
        if target.scheme == "https":
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(request)
        line = _status_line(sock, deadline)
    finally:
        sock.close()
    parts = line.split(b" ", 2)
    # Three digits, as HTTP has them: a longer number would not fit the
    # delivery's response code, and recording it failed.
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not (len(parts[1]) == 3 and parts[1].isdigit()):
        raise Unreachable(f"the receiver did not answer HTTP ({line[:60]!r})")
    return int(parts[1])


def post(url: str, body: bytes, headers: dict[str, str], *, networks: Sequence[str], timeout: float) -> Outcome:
    """POST `body` to `url` once; never raises for what the receiver does."""
    try:
        target = parse_url(url)
        # One deadline for the lookup and the exchange together.
        deadline = time.monotonic() + timeout
        address = resolve(target, networks, timeout=timeout)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        status = _exchange(target, address, _request(target, body, headers), left)
    except Refused as exc:
        return Outcome(False, retry=False, refused=True, message=str(exc))
    except ValueError as exc:
        return Outcome(False, retry=False, message=f"not sent: {exc}")
    except Unreachable as exc:
        return Outcome(False, retry=True, message=str(exc))
    except TimeoutError:
        return Outcome(False, retry=True, message=f"no answer within {timeout:g} s")
    except ssl.SSLError as exc:
        return Outcome(False, retry=True, message=f"TLS failed: {exc.reason or exc}")
    except OSError as exc:
        return Outcome(False, retry=True, message=f"cannot connect to {url}: {exc.strerror or exc}")
    return _judge(status)


def _judge(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome(True, retry=False, status=status, message=f"HTTP {status}")
    if 300 <= status < 400:
        return Outcome(False, retry=False, status=status, message=f"HTTP {status}: redirects are not followed")
    if status in (408, 425, 429) or status >= 500:
        return Outcome(False, retry=True, status=status, message=f"HTTP {status}")
    return Outcome(False, retry=False, status=status, message=f"HTTP {status}: the receiver refused it")

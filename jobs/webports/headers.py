"""What the proxy passes on, each way: never a credential of the portal's.

Towards the job: no portal cookie (session, CSRF, messages), not the proxy's
own cookie, no Authorization, no CSRF header, no hop-by-hop header; the
X-Forwarded-* headers are ours, never the client's. Towards the browser: no
cookie the job sets under one of those names, and no Domain attribute (a
cookie a job sets stays on its own task host).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from jobs.services.webports import COOKIE_NAME, SECURE_COOKIE_NAME

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"proxy-authorization", b"proxy-authenticate",
})
# Never towards the job, whatever the protocol.
CREDENTIALS = frozenset({b"authorization", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"forwarded"})
# The WebSocket client library makes these itself.
WEBSOCKET_OWN = frozenset({b"host", b"origin", b"sec-websocket-key", b"sec-websocket-version",
                           b"sec-websocket-extensions", b"sec-websocket-protocol", b"sec-websocket-accept"})


def csrf_header() -> bytes:
    """settings.CSRF_HEADER_NAME ("HTTP_X_CSRFTOKEN") as a header name."""
    return settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-").lower().encode()


def private_cookie_names() -> frozenset[str]:
    return frozenset({COOKIE_NAME, SECURE_COOKIE_NAME, settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME,
                      settings.LANGUAGE_COOKIE_NAME, "messages"})


def cookie_pairs(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """(name, value) of every cookie the client sent, in order, duplicates kept."""
    pairs = []
    for name, value in headers:
        if name.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, sep, val = part.strip().partition("=")
            if sep:
                pairs.append((key.strip(), val.strip()))
    return pairs


def _connection_tokens(headers: Headers) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens


def to_job(headers: Headers, *, client: str, scheme: str, websocket: bool = False) -> Headers:
    """The request's headers as the job gets them."""
    drop = HOP_BY_HOP | CREDENTIALS | _connection_tokens(headers) | {csrf_header(), b"cookie"}
    if websocket:
        drop |= WEBSOCKET_OWN
    # Every X-Forwarded-* of the client's (-port, -prefix ... too): the job
    # gets ours only.
    kept = [(name.lower(), value) for name, value in headers
            if name.lower() not in drop and not name.lower().startswith(b"x-forwarded-")]
    private = private_cookie_names()
    cookies = "; ".join(f"{k}={v}" for k, v in cookie_pairs(headers) if k not in private)
    if cookies:
        kept.append((b"cookie", cookies.encode("latin-1")))
    host = next((value for name, value in headers if name.lower() == b"host"), b"")
    kept += [(b"x-forwarded-for", client.encode()), (b"x-forwarded-proto", scheme.encode()),
             (b"x-forwarded-host", host)]
    return kept


def _set_cookie(value: bytes) -> bytes | None:
    """A job's Set-Cookie as the browser gets it; None to drop it."""
    text = value.decode("latin-1")
    name = text.split("=", 1)[0].strip()
    if name in private_cookie_names():
        return None
    attributes = [part for part in text.split(";")]
    kept = [attributes[0]] + [a for a in attributes[1:] if a.strip().split("=", 1)[0].strip().lower() != "domain"]
    return ";".join(kept).encode("latin-1")


def to_browser(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The job's response headers as the browser gets them."""
    headers = [(name.lower(), value) for name, value in headers]
    drop = HOP_BY_HOP | _connection_tokens(headers)
    if any(name == b"transfer-encoding" for name, _ in headers):
        # The body was framed by its chunks (RFC 9112, 6.3: they override a
        # length, which a proxy must drop); a length passed on would
        # contradict the body the browser gets.
        drop |= {b"content-length"}
    kept: Headers = []
    for name, value in headers:
        if name in drop:
            continue
        if name == b"set-cookie":
            cookie = _set_cookie(value)
            if cookie is not None:
                kept.append((name, cookie))
            continue
        kept.append((name, value))
    return kept

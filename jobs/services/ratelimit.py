"""Rate limits. First, failed-login limits, shared by POST /api/v1/token, the web login form and
the Django admin's login.

Three counters, each over LOGIN_FAILURE_WINDOW_SECONDS:
- a username from one client address: LOGIN_FAILURES_ALLOWED failures, then
  that pair must wait, right password or not (otherwise guessing would go on
  with the answer simply withheld);
- one client address over all usernames: five times as many, which stops
  spraying one password over many names;
- one username over all addresses: twenty times as many, which stops
  guessing spread over many addresses. It does not apply from an address the
  user logged in from successfully before (kept LOGIN_TRUSTED_SECONDS), so an
  attacker elsewhere can slow the account for strangers but never lock its
  owner out of the places they use.
Counters live in the Django cache (Redis), so every gunicorn worker sees the
same counts.

If the cache is unreachable the limiter lets logins through: a Redis outage
must not lock everyone out of the portal.

Credentials that name no account (node join tokens) count only the first
kind's per-address counter (address_wait_seconds and its neighbours).

Second, plain per-user action limits (action_wait_seconds), such as the
Submit page's live check of the config as it is typed and API submissions
per user, counted in Redis directly (one round trip per action).
"""

from __future__ import annotations

import hashlib
import logging
import time
import unicodedata
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from redis.exceptions import RedisError

from jobs import queues
from jobs.models import User

log = logging.getLogger(__name__)

ADDRESS_FACTOR = 5
USERNAME_FACTOR = 20
LOGIN_TRUSTED_SECONDS = 30 * 24 * 3600


def client_address(request: HttpRequest) -> str:
    """The client's address; behind a trusted proxy (PORTAL_BEHIND_PROXY),
    the last hop the proxy added to X-Forwarded-For."""
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None):
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            return hops[-1][:64]
    return request.META.get("REMOTE_ADDR", "")[:64] or "unknown"


def digest(value: str) -> str:
    """A short fixed-length stand-in for a name or address in a Redis key."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _keys(kind: str, value: str) -> tuple[str, str]:
    hashed = digest(value)
    return f"login-fail:{kind}:{hashed}:n", f"login-fail:{kind}:{hashed}:since"


def _name(username: str) -> str:
    # NFKC as the login forms' UsernameField does before it looks the user
    # up: "ａｄｍｉｎ" signs in as "admin", so it must count as "admin", not
    # open a fresh allowance per spelling.
    return unicodedata.normalize("NFKC", username).strip().lower()


def _pair(username: str, address: str) -> str:
    return f"{_name(username)}\0{address}"  # NUL: in neither a username nor an address


def _trusted_key(username: str, address: str) -> str:
    return f"login-ok:{digest(_pair(username, address))}"


def _counters(username: str, address: str) -> list[tuple[tuple[str, str], int]]:
    allowed = settings.LOGIN_FAILURES_ALLOWED
    return [
        (_keys("pair", _pair(username, address)), allowed),
        (_keys("addr", address), allowed * ADDRESS_FACTOR),
        (_keys("user", _name(username)), allowed * USERNAME_FACTOR),
    ]


def login_wait_seconds(*, username: str, address: str) -> int:
    """0 if a login may be tried now, else how many seconds to wait."""
    try:
        counters = _counters(username, address)
        if cache.get(_trusted_key(username, address)):
            counters = counters[:2]  # the owner's own place: strangers' failures do not count here
        return _wait_for(counters)
    except Exception:  # the cache is down: let the login through (see above)
        log.warning("login rate limit unavailable", exc_info=True)
    return 0


def _wait_for(counters: list[tuple[tuple[str, str], int]]) -> int:
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    for (count_key, since_key), allowed in counters:
        values = cache.get_many([count_key, since_key])
        if int(values.get(count_key) or 0) >= allowed:
            since = float(values.get(since_key) or time.time())
            return max(1, int(since + window - time.time()) + 1)
    return 0


def login_failed(*, username: str, address: str) -> None:
    try:
        _count_failure(_counters(username, address))
    except Exception:
        log.warning("login rate limit unavailable", exc_info=True)


def _count_failure(counters: list[tuple[tuple[str, str], int]]) -> None:
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    for (count_key, since_key), _allowed in counters:
        # add() only sets a missing key: the window starts at the first
        # failure and is not pushed back by later ones.
        cache.add(since_key, time.time(), timeout=window)
        cache.add(count_key, 0, timeout=window)
        cache.incr(count_key)


def login_succeeded(*, username: str, address: str) -> None:
    """A right password clears the pair's count and trusts the address for
    this user; the address's and the username's own counts stay."""
    try:
        cache.delete_many(list(_keys("pair", _pair(username, address))))
        cache.set(_trusted_key(username, address), 1, timeout=LOGIN_TRUSTED_SECONDS)
    except Exception:
        log.warning("login rate limit unavailable", exc_info=True)


def login_reset(*, username: str = "", address: str = "") -> None:
    """Forget counts (an admin unlocking an account; tests)."""
    keys: list[str] = []
    if username:
        keys += _keys("user", _name(username))
    if address:
        keys += _keys("addr", address)
    if username and address:
        keys += _keys("pair", _pair(username, address))
    try:
        cache.delete_many(keys)
    except Exception:
        log.warning("login rate limit unavailable", exc_info=True)


# Failed credentials that name no account (a node's join token): counted per
# client address only, LOGIN_FAILURES_ALLOWED per window, in counters of
# their own kind. There is no count over all addresses as a username has:
# such a count is one an attacker fills from addresses of their own to hold
# up everyone else, and a secret of 256 random bits needs none (finding 27).


def _address_counters(kind: str, address: str) -> list[tuple[tuple[str, str], int]]:
    return [(_keys(f"{kind}:addr", address), settings.LOGIN_FAILURES_ALLOWED)]


def address_wait_seconds(*, kind: str, address: str) -> int:
    """0 if `address` may try a `kind` credential now, else how many seconds to wait."""
    try:
        return _wait_for(_address_counters(kind, address))
    except Exception:  # the cache is down: let it through, as logins
        log.warning("rate limit unavailable", exc_info=True)
    return 0


def address_failed(*, kind: str, address: str) -> None:
    try:
        _count_failure(_address_counters(kind, address))
    except Exception:
        log.warning("rate limit unavailable", exc_info=True)


def address_reset(*, kind: str, address: str) -> None:
    """Forget the address's count: a right credential (a node that mistyped
    its token before), an admin, tests."""
    try:
        cache.delete_many(list(_keys(f"{kind}:addr", address)))
    except Exception:
        log.warning("rate limit unavailable", exc_info=True)


# One command instead of a MULTI of four: the same steps, atomic as a
# script is, for a fraction of the client's work per submission. NX: the
# window starts at the first action and later ones do not push it back.
_COUNT_ACTION = """
redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2])
redis.call('SET', KEYS[1], 0, 'NX', 'EX', ARGV[2])
local count = redis.call('INCR', KEYS[1])
return {count, redis.call('GET', KEYS[2])}
"""


def _count_action(key: str, since_key: str, now: float, window: int) -> tuple[int, bytes | None]:
    """(the count after this action, when the window began)."""
    count, since = queues.script(_COUNT_ACTION)(keys=[key, since_key], args=[repr(now), window])
    return int(count), since


def action_wait_seconds(*, action: str, who: str, limit: int, window: int) -> int:
    """Count one `action` by `who` (a user id, a token); 0 if it is within
    `limit` per `window` seconds, else how many seconds until it is. A fixed
    window, and a burst can never pass 2 x limit. One round trip to Redis on
    the queues' shared connection: it is asked on every API submission,
    where Django's cache (a client object built per call, a round trip per
    step) cost as much as storing the job."""
    key = f"{settings.PAI_INSTANCE}:action:{action}:{digest(who)}"
    now = time.time()
    try:
        count, since = _count_action(key, key + ":since", now, window)
    except RedisError:  # Redis is down: never block work on the limiter
        log.warning("rate limit unavailable", exc_info=True)
        return 0
    if count <= limit:
        return 0
    return max(1, int(float(since or now) + window - now) + 1)


class LoginThrottled(Exception):
    """Too many failed logins: the next try must wait `wait` seconds."""

    def __init__(self, wait: int) -> None:
        self.wait = wait
        self.message = f"Too many failed logins; try again in {wait} seconds."
        super().__init__(self.message)


class LoginFailed(Exception):
    """The username or password is wrong (which one is not said)."""


def attempt_login(request: HttpRequest, *, username: str, password: str = "",
                  check: Callable[[], User | None] | None = None) -> User | None:
    """One login under the limit, for the API and the web login form alike.

    Raises LoginThrottled while `username` or the client's address must wait.
    Otherwise checks the password with authenticate() and returns the user,
    or raises LoginFailed. A form passes its own `check` instead: it returns
    the user, None when nothing was tried (a field was missing), or raises
    ValidationError. A failure is counted; a success clears the username's count.
    """
    address = client_address(request)
    wait = login_wait_seconds(username=username, address=address)
    if wait:
        raise LoginThrottled(wait)
    try:
        user = check() if check else _authenticated(request, username=username, password=password)
    except (LoginFailed, ValidationError):
        login_failed(username=username, address=address)
        raise
    if user is not None:
        login_succeeded(username=username, address=address)
    return user


def _authenticated(request: HttpRequest, *, username: str, password: str) -> User:
    user = authenticate(request, username=username, password=password)
    if user is None:
        raise LoginFailed
    return user

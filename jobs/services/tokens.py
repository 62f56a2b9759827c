"""API tokens: made by POST /api/v1/token or on the profile page, used as
`Authorization: Bearer <token>`, revoked by their owner, expiring on their own.

Only the SHA-256 of a token is stored, so a copy of the database does not
hand out working tokens; the token itself is shown once, when it is made.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.models import ApiToken, User, lock_user_row
from jobs.services import permissions_memo

TOKEN_PREFIX = "pai_"
# Tokens from POST /api/v1/token: OpenPAI's `expiration`, in seconds.
API_MIN_SECONDS = 60
API_MAX_SECONDS = 7 * 24 * 3600
API_DEFAULT_SECONDS = 24 * 3600
# Tokens made on the profile page may live longer (for scripts and CI).
PAGE_MAX_DAYS = 365
# last_used_at is written at most this often per token: a busy script must
# not turn every read into a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# Expired or revoked tokens are kept this long for the owner's list, then dropped.
KEEP_DEAD_TOKENS = timedelta(days=30)
# Live (unexpired, unrevoked) tokens one user may hold: far above a person's
# scripts and laptops, low enough that one account cannot grow the table
# (and the profile page) without bound.
MAX_LIVE_TOKENS_PER_USER = 500
# Expired or revoked tokens one user keeps (the newest), whatever their age:
# a token revoked or expired at once frees its live place, so without this
# a loop of make and revoke grew the table by a row per turn for
# KEEP_DEAD_TOKENS. The owner's list shows at most 200 tokens anyway.
MAX_DEAD_TOKENS_KEPT = 100


@dataclass(frozen=True)
class NewToken:
    token: ApiToken
    key: str  # the secret; never stored, shown once


def key_hash(key: str) -> str:
    """What is stored of a secret key (API tokens, node join tokens)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class TooManyTokens(Exception):
    """The user holds MAX_LIVE_TOKENS_PER_USER live tokens already."""

    def __init__(self) -> None:
        super().__init__(f"you hold {MAX_LIVE_TOKENS_PER_USER} live API tokens already, the most one user may; "
                         "revoke some on your profile page (or let them expire) first")


class CredentialsChanged(Exception):
    """The user's password changed (or the user went) after they were
    authenticated for this token: it would outlive the revocation."""

    def __init__(self) -> None:
        super().__init__("your password was changed while the token was being made; sign in again")


def token_create(*, user: User, lifetime: timedelta, label: str = "") -> NewToken:
    """A new token for `user` as they were authenticated (their password hash
    then is `user.password`)."""
    key = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        # The user's row, locked, makes the count and the insert one step for
        # that user's concurrent requests (PostgreSQL; SQLite takes one
        # writer at a time anyway), and orders this against a password change
        # (users.user_change_password), which revokes every token under it.
        current = lock_user_row(user.pk)
        if current is None or current != user.password:
            raise CredentialsChanged()
        live = ApiToken.objects.filter(user=user, revoked_at__isnull=True, expires_at__gt=now)
        if live.count() >= MAX_LIVE_TOKENS_PER_USER:
            raise TooManyTokens()
        token = ApiToken.objects.create(
            user=user, key_hash=key_hash(key), prefix=key[:12], label=label[:100], created_at=now,
            expires_at=now + lifetime,
        )
    long_dead = now - KEEP_DEAD_TOKENS
    ApiToken.objects.filter(Q(expires_at__lt=long_dead) | Q(revoked_at__lt=long_dead), user=user).delete()
    _drop_dead_past_kept(user, now)
    return NewToken(token=token, key=key)


def _drop_dead_past_kept(user: User, now: datetime) -> None:
    """Drop `user`'s dead tokens but the newest MAX_DEAD_TOKENS_KEPT. Making
    a token is the only way a row is added, so a user's rows stay under the
    live limit plus this."""
    dead = ApiToken.objects.filter(Q(revoked_at__isnull=False) | Q(expires_at__lte=now), user=user)
    cutoff = list(dead.order_by("-id").values_list("id", flat=True)[MAX_DEAD_TOKENS_KEPT:MAX_DEAD_TOKENS_KEPT + 1])
    if cutoff:
        dead.filter(id__lte=cutoff[0]).delete()


def token_revoke(*, token: ApiToken) -> bool:
    """Revoke a token; False if it already was."""
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 1
    if revoked:
        permissions_memo.permissions_changed()  # an UPDATE sends no signal
    return revoked


def tokens_revoke_all(*, user: User, keep_key: str | None = None) -> int:
    """Revoke every live token of `user` but the one whose secret is `keep_key`."""
    live = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
    if keep_key:
        live = live.exclude(key_hash=key_hash(keep_key))
    revoked = live.update(revoked_at=timezone.now())
    if revoked:
        permissions_memo.permissions_changed()  # an UPDATE sends no signal
    return revoked


class TokenRejected(Exception):
    """The token is unknown, expired, revoked, or its user may not log in."""


def token_authenticate(key: str) -> User:
    """The user a bearer token stands for, or TokenRejected saying why."""
    if not key.startswith(TOKEN_PREFIX) or len(key) > 200:
        raise TokenRejected("the token is not valid")
    digest = key_hash(key)
    try:
        # The token row and its user are shared by this process's threads:
        # read, never changed, except last_used_at below.
        token = permissions_memo.remembered(("token", digest), lambda: _token_with_user(digest))
    except ApiToken.DoesNotExist:
        raise TokenRejected("the token is not valid") from None
    now = timezone.now()
    if token.revoked_at is not None:
        raise TokenRejected("the token was revoked")
    if token.expires_at <= now:
        raise TokenRejected("the token has expired; get a new one with POST /api/v1/token")
    if not token.user.is_active:
        raise TokenRejected("the token's user is disabled")
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now  # so this process writes it once a minute, not per call
    return copy.copy(token.user)  # the caller's own, free to change


def _token_with_user(digest: str) -> ApiToken:
    token = ApiToken.objects.select_related("user").get(key_hash=digest)
    token.user.is_admin  # noqa: B018 -- read now, so the remembered user carries its permission cache
    return token

"""Node join tokens: an admin makes one (Nodes page, `manage.py node_token`,
the REST API), a new node machine hands it to `scripts/join-node`, which
trades it at `POST /api/v2/nodes/join` for the node's settings
(node_settings.py). No secret is copied by hand.

Only the SHA-256 of a token is stored, as for API tokens: a copy of the
database hands out no working join token. A token may be used any number of
times (one token for a rack of machines) until it expires or is revoked;
every use is counted with its time and client address.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Q
from django.utils import timezone

from jobs.models import NodeJoinToken, User
from jobs.services.tokens import key_hash

TOKEN_PREFIX = "pjt_"
PREFIX_LENGTH = 12  # "pjt_" and 8 random characters: shown, and enough to revoke by
DEFAULT_SECONDS = 24 * 3600  # as kubeadm's join tokens
MIN_SECONDS = 60
MAX_SECONDS = 30 * 24 * 3600
# Expired or revoked tokens stay listed this long, then go.
KEEP_DEAD_TOKENS = timedelta(days=30)


class JoinTokenError(Exception):
    """A join token was refused. `reason`: missing, unknown, expired or
    revoked; `message` says what to do, in words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class NewJoinToken:
    token: NodeJoinToken
    key: str  # the secret; never stored, shown once


def _new_key() -> str:
    """A new token whose part after "pjt_" never starts with "-": that part
    is what an admin may give to revoke it (`node_token --revoke Ab12Cd34`),
    and argparse reads an argument starting with "-" as an option, so
    `--revoke -b12Cd34` was refused with "expected one argument" for one
    token in 64. Dropping those keys costs 0.02 of the key's 256 bits."""
    while True:
        key = TOKEN_PREFIX + secrets.token_urlsafe(32)
        if not key.startswith(TOKEN_PREFIX + "-"):
            return key


def join_token_create(*, by: User | None, seconds: int = DEFAULT_SECONDS, label: str = "") -> NewJoinToken:
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(f"the lifetime must be {MIN_SECONDS} to {MAX_SECONDS} seconds, not {seconds}")
    key = _new_key()
    now = timezone.now()
    token = NodeJoinToken.objects.create(
        key_hash=key_hash(key), prefix=key[:PREFIX_LENGTH], label=label[:100], created_by=by, created_at=now,
        expires_at=now + timedelta(seconds=seconds),
    )
    long_dead = now - KEEP_DEAD_TOKENS
    NodeJoinToken.objects.filter(Q(expires_at__lt=long_dead) | Q(revoked_at__lt=long_dead)).delete()
    return NewJoinToken(token=token, key=key)


def join_tokens_matching(prefix: str) -> list[NodeJoinToken]:
    """Tokens whose shown prefix starts with `prefix` (with or without
    "pjt_"), or the one token that is `prefix` in full."""
    prefix = prefix.strip()
    whole = NodeJoinToken.objects.filter(key_hash=key_hash(prefix)).first()
    if whole is not None:
        return [whole]
    if not prefix.startswith(TOKEN_PREFIX):
        prefix = TOKEN_PREFIX + prefix
    if len(prefix) <= len(TOKEN_PREFIX):
        return []
    prefix = prefix[:PREFIX_LENGTH]
    # SQLite's LIKE ignores case (PostgreSQL's does not): "pjt_ab" found
    # pjt_AB… too, another token, which --revoke then revoked if it was the only one.
    return [t for t in NodeJoinToken.objects.filter(prefix__startswith=prefix) if t.prefix.startswith(prefix)]


def join_token_revoke(*, token: NodeJoinToken) -> bool:
    """Revoke a token; False if it already was. Nodes that joined with it
    keep running: they hold their settings already (SECURITY.md, Nodes)."""
    return NodeJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 1


def join_token_use(key: str, *, client: str) -> NodeJoinToken:
    """The token `key` names, counted as used from `client`; raises
    JoinTokenError saying why it is refused."""
    if not key:
        raise JoinTokenError("missing", "send the join token as 'Authorization: Bearer <token>'")
    token = NodeJoinToken.objects.filter(key_hash=key_hash(key)).first()
    shown = key[:PREFIX_LENGTH] + "…" if key.startswith(TOKEN_PREFIX) else "given"
    if token is None:
        raise JoinTokenError("unknown", f"the join token ({shown}) is not known to this portal: mistyped, or made "
                                        "by another portal? Ask an admin for a token (Nodes page, or "
                                        "`manage.py node_token`).")
    now = timezone.now()
    refused = _refusal(token, now)
    if refused is not None:
        raise refused
    # Counted only while still valid: a token revoked since the read above
    # (an admin's page at that moment) hands out no settings.
    counted = NodeJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True, expires_at__gt=now).update(
        uses=F("uses") + 1, last_used_at=now, last_used_from=client[:255])
    token.refresh_from_db()
    if not counted:
        raise _refusal(token, now) or JoinTokenError("revoked", f"the join token {token.prefix}… was revoked.")
    return token


def _refusal(token: NodeJoinToken, now: datetime) -> JoinTokenError | None:
    if token.revoked_at is not None:
        return JoinTokenError("revoked", f"the join token {token.prefix}… was revoked at "
                                         f"{token.revoked_at.isoformat(timespec='seconds')}; ask an admin for a new one.")
    if token.expires_at <= now:
        return JoinTokenError("expired", f"the join token {token.prefix}… expired at "
                                         f"{token.expires_at.isoformat(timespec='seconds')}; ask an admin for a new one.")
    return None

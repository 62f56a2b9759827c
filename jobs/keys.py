"""SSH key pairs for jobs, their private keys sealed at rest, and checks
of users' public keys.

A job's private key (and its protocol v2 secrets: seal_secrets) is stored sealed (Fernet: AES-CBC with an HMAC) with a
key derived (HKDF-SHA256) from Django's SECRET_KEY, so a copy of the
database alone (a backup, a stolen SQLite file) gives no way into running
tasks. Keys sealed under a SECRET_KEY_FALLBACKS entry still open, so the
secret key can be rotated. Sealed values start with SEALED_PREFIX; a value
without it is a plaintext row from before and is read as it is.
`open_private_key` is the one reader: the key page, the API and the node
runner (a task's peer key) all go through it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

SEALED_PREFIX = "pai-sealed:v1:"
_HKDF_INFO = b"pai job ssh private keys v1"

_ALLOWED_TYPES = (
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
)


def new_key_pair(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH PEM, public key line) for a new ed25519 key."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


class SealedKeyUnreadable(ValueError):
    """No current or fallback secret key opens a stored private key."""


@functools.lru_cache(maxsize=16)
def _fernet(secret: str) -> Fernet:
    """Kept per secret: the derivation would otherwise run on every
    submission, and a Fernet holds nothing that changes between uses."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(secret.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _sealer() -> MultiFernet:
    """Seals with SECRET_KEY; opens with it or any of SECRET_KEY_FALLBACKS."""
    return MultiFernet([_fernet(settings.SECRET_KEY), *(_fernet(old) for old in settings.SECRET_KEY_FALLBACKS)])


def seal_private_key(private_key: str) -> str:
    """What the database stores for a job's private key."""
    if not private_key:
        return ""
    return SEALED_PREFIX + _sealer().encrypt(private_key.encode()).decode("ascii")


def open_private_key(stored: str) -> str:
    """The private key a stored value holds (plaintext rows from before
    sealing are returned as they are). Raises SealedKeyUnreadable."""
    if not stored.startswith(SEALED_PREFIX):
        return stored
    try:
        return _sealer().decrypt(stored[len(SEALED_PREFIX):].encode("ascii")).decode()
    except (InvalidToken, ValueError):
        raise SealedKeyUnreadable("the job's SSH private key was sealed with a secret key this portal no longer "
                                  "has; add the old key to PORTAL_SECRET_KEY_FALLBACKS") from None


def resealed(stored: str) -> str | None:
    """`stored` sealed under the current secret key, or None when it already
    is (or is empty). Plaintext rows from before sealing get sealed; rows
    sealed under a fallback key get sealed again under the current one, so
    that the fallback can be dropped after a rotation. Raises
    SealedKeyUnreadable when no key opens it."""
    if not stored:
        return None
    if not stored.startswith(SEALED_PREFIX):
        return seal_private_key(stored)
    token = stored[len(SEALED_PREFIX):].encode("ascii")
    try:
        _fernet(settings.SECRET_KEY).decrypt(token)
        return None
    except (InvalidToken, ValueError):
        pass
    try:
        return SEALED_PREFIX + _sealer().rotate(token).decode("ascii")
    except (InvalidToken, ValueError):
        raise SealedKeyUnreadable("a stored value was sealed with a secret key this portal no longer has; "
                                  "add the old key to PORTAL_SECRET_KEY_FALLBACKS") from None


def seal_secrets(secrets: dict) -> str:
    """What the database stores for a job's protocol v2 secrets."""
    if not secrets:
        return ""
    return seal_private_key(json.dumps(secrets, ensure_ascii=False))


def open_secrets(stored: str) -> dict:
    """A job's secrets for its node agent (empty when it has none)."""
    if not stored:
        return {}
    value = json.loads(open_private_key(stored))
    return value if isinstance(value, dict) else {}


class BadPublicKey(ValueError):
    pass


def check_public_key(text: str) -> tuple[str, str]:
    """Validate one OpenSSH public key line; return (normalized line, fingerprint)."""
    if "PRIVATE KEY" in text:
        raise BadPublicKey("this is a private key: paste the public key (the .pub file) instead, "
                           "and keep the private key to yourself")
    parts = text.strip().split()
    if len(parts) < 2 or "\n" in text.strip():
        raise BadPublicKey("expected one line like 'ssh-ed25519 AAAA... you@laptop'")
    kind, blob = parts[0], parts[1]
    if kind not in _ALLOWED_TYPES:
        raise BadPublicKey(f"unsupported key type {kind!r}; expected one of {', '.join(_ALLOWED_TYPES[:3])} ...")
    try:
        raw = base64.b64decode(blob, validate=True)
        serialization.load_ssh_public_key(f"{kind} {blob}".encode())
    except Exception:  # any decoding failure means the same thing to the user
        raise BadPublicKey("the key data is not valid base64 OpenSSH key material") from None
    digest = base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")
    return " ".join(parts[:3]), f"SHA256:{digest}"

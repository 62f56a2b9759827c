"""SSH key pairs for jobs, and checks of users' public keys."""

from __future__ import annotations

import base64
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

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

"""scripts/join-node's one step in Python: trade a join token for the node's
settings at the portal (`POST /api/v2/nodes/join`) and write them to the
node's settings file, mode 0600. Standard library only and no Django: it
runs before the node has any settings.

    python -m jobs.node.join PORTAL_URL ENV_FILE [--ca-file PEM]

The token comes in the environment (PAI_JOIN_TOKEN), not the command line,
so it does not show in the process list twice.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

JOIN_PATH = "/api/v2/nodes/join"


class JoinFailed(Exception):
    pass


def join_url(portal_url: str) -> str:
    parts = urlsplit(portal_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JoinFailed(f"the portal URL {portal_url!r} must be http(s)://host[:port], e.g. https://portal.example:8000")
    return portal_url.rstrip("/") + JOIN_PATH


def fetch_settings(portal_url: str, token: str, *, ca_file: str = "", timeout: float = 30.0) -> dict:
    """The portal's answer: {"settings": {...}, "warnings": [...], ...}."""
    request = urllib.request.Request(join_url(portal_url), data=b"{}", method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"})
    context = ssl.create_default_context(cafile=ca_file or None)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise JoinFailed(f"the portal refused (HTTP {exc.code}): {_message(exc)}") from None
    except urllib.error.URLError as exc:
        raise JoinFailed(f"could not reach the portal at {portal_url}: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise JoinFailed(f"could not read the portal's answer from {portal_url}: {exc}") from None


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read().decode("utf-8"))
        return f"{body.get('message')} ({body.get('code')})"
    except (ValueError, OSError, AttributeError):
        return exc.reason or "no message"


def env_file_text(values: dict[str, str]) -> str:
    """KEY='value' lines: read by bash (`set -a; . FILE`) and by systemd's
    EnvironmentFile= alike. The portal never sends a value with a quote or
    a newline; one here would be refused rather than written wrong."""
    lines = ["# Written by scripts/join-node from the portal's answer; holds secrets (mode 0600)."]
    for name, value in sorted(values.items()):
        if not name.replace("_", "").isalnum() or "'" in value or "\n" in value or "\0" in value:
            raise JoinFailed(f"the portal sent a setting this file cannot hold: {name}")
        lines.append(f"{name}='{value}'")
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner alone, replacing it whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.node.join")
    parser.add_argument("portal_url")
    parser.add_argument("env_file", type=Path)
    parser.add_argument("--ca-file", default="", help="CA certificates (PEM) to trust for the portal's HTTPS")
    args = parser.parse_args(argv)
    token = os.environ.get("PAI_JOIN_TOKEN", "").strip()
    try:
        if not token:
            raise JoinFailed("no join token given (PAI_JOIN_TOKEN is empty)")
        answer = fetch_settings(args.portal_url, token, ca_file=args.ca_file)
        write_private(args.env_file, env_file_text(answer["settings"]))
    except (JoinFailed, KeyError, TypeError, AttributeError) as exc:
        print(f"error: {exc if isinstance(exc, JoinFailed) else 'the portal sent no settings'}", file=sys.stderr)
        return 1
    for warning in answer.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {len(answer['settings'])} settings to {args.env_file} (token valid until "
          f"{answer.get('tokenExpiresAt', '?')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

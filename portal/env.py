"""Typed readers for settings taken from environment variables.

Every reader raises ImproperlyConfigured naming the variable and what was
expected, so a typo in a deployment fails at start-up instead of at 3 a.m.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected one of true/false/1/0/yes/no/on/off")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a whole number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: expected at least {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value}: expected at most {maximum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: expected at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_port_list(name: str) -> frozenset[int]:
    """Ports and ranges: "6006,8888,9000-9010"."""
    ports: set[int] = set()
    for item in env_list(name, []):
        first, _, last = item.partition("-")
        if not (first.isdigit() and (not last or last.isdigit())):
            raise ImproperlyConfigured(f"{name}: {item!r} is not a port or a range like 9000-9010")
        low, high = int(first), int(last or first)
        if not 1 <= low <= high <= 65535:
            raise ImproperlyConfigured(f"{name}: {item!r} is not within 1-65535")
        ports.update(range(low, high + 1))
    return frozenset(ports)


def env_float_list(name: str, default: list[float], *, minimum: float = 0.0) -> list[float]:
    """Numbers separated by commas: "10,60,300"."""
    values = []
    for item in env_list(name, [str(value) for value in default]):
        try:
            value = float(item)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a number") from None
        if value < minimum:
            raise ImproperlyConfigured(f"{name}: {item!r} is less than {minimum}")
        values.append(value)
    return values


def env_network_list(name: str, default: list[str], *, keywords: tuple[str, ...] = ()) -> list[str]:
    """CIDRs ("10.0.0.0/8", "2001:db8::/32", a bare address) and the given
    keywords, separated by commas; empty means the default."""
    import ipaddress

    values = env_list(name, default) or list(default)
    for item in values:
        if item in keywords:
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            expected = " or ".join(("a CIDR such as 10.0.0.0/8", *keywords))
            raise ImproperlyConfigured(f"{name}: {item!r} is not {expected}") from None
    return values


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def private_folder(path: Path, *, name: str) -> None:
    """Make `path` (0700) when missing; close it to others when it is ours
    and open to them. A folder of another user's that others may enter
    stops the start-up, naming the variable."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    # 0710 with the group postgres is kept: the local PostgreSQL's user passes
    # through to its own data folder there and can list or read nothing else
    # (SECURITY.md, finding 12).
    postgres = _is_postgres_group(info.st_gid)
    if not mode & 0o077 or (postgres and mode & 0o077 == 0o010):
        return
    if info.st_uid != os.geteuid():
        raise ImproperlyConfigured(f"{name}={str(path)!r} is open to other users and not ours to close: "
                                   "expected a folder of the portal's user with mode 0700")
    os.chmod(path, 0o710 if postgres else 0o700)


def _is_postgres_group(gid: int) -> bool:
    import grp

    try:
        return grp.getgrgid(gid).gr_name == "postgres"
    except KeyError:
        return False

"""Kinds of storage, found by URI scheme ("file", "hdfs") or by the
STORAGE_BACKEND name that picks one ("local", "webhdfs").

Each backend module registers its kind when imported (see the end of
local.py and webhdfs.py): the scheme of its URIs, how those URIs name the
cluster, what PAI_DEFAULT_FS_URI defaults to, the settings it is made from
and a factory. paths.py, the storage package and portal/settings.py ask
here; nothing else branches on the backend. docs/backends.md shows how to
add one (S3, NFS).

BACKENDS below is the one list of STORAGE_BACKEND values: settings checks
the variable against it at start-up, and the first lookup of a name imports
its module, so a backend's client library (`hdfs`, one day `boto3`) is
loaded only where that backend is configured. Settings imports this
package, so nothing here may import models or other app code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from jobs.storage.base import Backend

# STORAGE_BACKEND value -> the module that registers that kind of storage.
BACKENDS: dict[str, str] = {
    "local": "jobs.storage.local",
    "webhdfs": "jobs.storage.webhdfs",
}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)


@dataclass(frozen=True)
class StorageKind:
    """One kind of storage: how its URIs are written and how its backend is made.

    `names_host` says what sits between "//" and the path. False: no host
    (file:///alice/code; "localhost" is accepted too) and URIs start at
    "<scheme>://". True: the cluster (hdfs://namenode:9000/alice/code),
    which must be PAI_DEFAULT_FS_URI's own; URIs start at PAI_DEFAULT_FS_URI.
    """

    scheme: str  # "hdfs"
    backend: str  # its STORAGE_BACKEND value, "webhdfs"
    label: str  # "HDFS": "that is not this cluster's HDFS"
    where: str  # "on HDFS": "this portal keeps files on HDFS"
    names_host: bool
    default_fs_uri: str  # PAI_DEFAULT_FS_URI when the variable is empty
    fs_uri_hint: str  # what PAI_DEFAULT_FS_URI should look like, for the start-up error
    settings: tuple[str, ...]  # the settings `make` and `check` read (and the backend cache key)
    make: Callable[[Mapping[str, Any]], Backend]  # {setting: value} -> a backend
    check: Callable[[Mapping[str, Any]], str | None] = lambda values: None  # a start-up problem, or None

    def root(self, default_fs_uri: str) -> str:
        """What every URI of this storage starts with; a path follows."""
        return default_fs_uri.rstrip("/") if self.names_host else f"{self.scheme}://"

    def hosts(self, default_fs_uri: str) -> set[str]:
        """The authorities (lower case) a URI may name; "" is always fine."""
        return {"", urlsplit(default_fs_uri).netloc.lower() if self.names_host else "localhost"}

    def settings_of(self, source: Any) -> dict[str, Any]:
        """The settings this kind reads, from django.conf.settings or (in
        portal/settings.py) the module's globals()."""
        return {name: _setting(source, name) for name in self.settings}

    def check_settings(self, source: Any) -> None:
        """Fail at start-up, naming the variable, on settings this kind cannot use."""
        problem = self.check(self.settings_of(source))
        if problem:
            raise ImproperlyConfigured(problem)
        fs_uri = _setting(source, "PAI_DEFAULT_FS_URI")
        if not fs_uri.startswith(f"{self.scheme}://" if self.names_host else f"{self.scheme}:"):
            raise ImproperlyConfigured(f"PAI_DEFAULT_FS_URI={fs_uri!r} does not match STORAGE_BACKEND={self.backend}: "
                                       f"expected {self.fs_uri_hint}")


def _setting(source: Any, name: str) -> Any:
    return source[name] if isinstance(source, Mapping) else getattr(source, name)


_kinds: dict[str, StorageKind] = {}  # by scheme


def register_storage(kind: StorageKind) -> StorageKind:
    """Make `kind` findable. Backend modules call this when imported."""
    for other in _kinds.values():
        if other.backend == kind.backend and other.scheme != kind.scheme:
            raise ValueError(f"STORAGE_BACKEND={kind.backend} is already the {other.scheme}:// storage")
    current = _kinds.get(kind.scheme)
    if current is not None and current.backend != kind.backend:
        raise ValueError(f"{kind.scheme}:// is already STORAGE_BACKEND={current.backend}")
    _kinds[kind.scheme] = kind
    return kind


def storage_for_backend(name: str) -> StorageKind:
    """The kind STORAGE_BACKEND=`name` picks (importing its module on first use)."""
    for kind in _kinds.values():
        if kind.backend == name:
            return kind
    if name not in BACKENDS:
        raise ImproperlyConfigured(f"STORAGE_BACKEND={name!r}: expected one of {', '.join(BACKEND_NAMES)}")
    import_module(BACKENDS[name])
    for kind in _kinds.values():
        if kind.backend == name:
            return kind
    raise ImproperlyConfigured(f"{BACKENDS[name]} registers no storage for STORAGE_BACKEND={name}")


def storage_for_scheme(scheme: str) -> StorageKind | None:
    """The registered kind whose URIs start with `scheme`:, if any."""
    return _kinds.get(scheme.lower())

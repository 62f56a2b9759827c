"""What the storage page does for a signed-in user, with access checks.

Views call these and nothing below them; every function takes the Reader
(who is asking) and storage paths already located with `storage.locate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from jobs import storage
from jobs.storage import access, paths
from jobs.storage.access import Reader
from jobs.storage.base import Entry
from jobs.storage.errors import StorageError, StorageNotFound


@dataclass(frozen=True)
class Crumb:
    name: str
    path: str


@dataclass(frozen=True)
class Folder:
    """One folder as the page shows it."""

    path: str
    uri: str
    exists: bool
    entries: list[Entry]
    crumbs: list[Crumb]
    may_write: bool
    may_create: bool  # missing, and the reader may make it

    @property
    def parent(self) -> str | None:
        return None if self.path == paths.ROOT else paths.parent(self.path)


def home_of(reader: Reader) -> str:
    """Where the page opens: the home (made on first visit), else /Output/<user>."""
    home = reader.home if access.may_write(reader, reader.home) else reader.output_home
    if storage.backend().stat(home) is None:
        storage.backend().mkdir(home)
    return home


def crumbs(path: str) -> list[Crumb]:
    parts = [p for p in path.split("/") if p]
    return [Crumb("/", "/")] + [Crumb(name, "/" + "/".join(parts[: i + 1])) for i, name in enumerate(parts)]


def folder_open(reader: Reader, path: str) -> Folder:
    access.check_read(reader, path)
    entry = storage.backend().stat(path)
    if entry is not None and not entry.is_dir:
        raise StorageError(f"{path} is a file; download it instead")
    entries = [] if entry is None else storage.backend().list(path)
    entries = sorted((e for e in entries if access.may_read(reader, e.path)), key=lambda e: (not e.is_dir, e.name.lower()))
    writable = access.may_write(reader, path)
    return Folder(path=path, uri=storage.to_uri(path), exists=entry is not None, entries=entries, crumbs=crumbs(path),
                  may_write=writable and entry is not None, may_create=writable and entry is None)


def _name(name: str, what: str) -> str:
    """A relative name typed or sent by the browser: no `..`, not empty."""
    relative = paths.normalize("/" + name.replace("\\", "/"))
    if relative == paths.ROOT:
        raise StorageError(f"the {what} name is empty")
    return relative.lstrip("/")


def folder_create(reader: Reader, folder: str, name: str) -> str:
    path = paths.join(folder, _name(name, "folder")) if name else folder
    access.check_write(reader, path)
    existing = storage.backend().stat(path)
    if existing is not None:
        raise StorageError(f"{path} already exists")
    storage.backend().mkdir(path)
    return path


def files_save(reader: Reader, folder: str, items: list[tuple[str, BinaryIO]], *, overwrite: bool) -> list[str]:
    """Store uploaded files (relative name, stream) under `folder`. Checks
    every name first, so a refused upload stores nothing."""
    access.check_write(reader, folder)
    targets = [(paths.join(folder, _name(relative, "file")), stream) for relative, stream in items]
    if not targets:
        raise StorageError("no files were sent")
    backend = storage.backend()
    conflicts = []
    for path, _ in targets:
        access.check_write(reader, path)
        existing = backend.stat(path)
        if existing is not None and (existing.is_dir or not overwrite):
            conflicts.append(path)
    if conflicts:
        shown = ", ".join(conflicts[:5]) + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
        raise FileConflict(f"already there: {shown}; tick \"replace existing files\" to overwrite them")
    for path, stream in targets:
        backend.write(path, stream, overwrite=overwrite)
    return [path for path, _ in targets]


class FileConflict(StorageError):
    """An upload would replace files the user did not agree to replace."""


def file_read(reader: Reader, path: str) -> tuple[Entry, Iterator[bytes]]:
    access.check_read(reader, path)
    entry = storage.backend().require(path)
    if entry.is_dir:
        raise StorageError(f"{path} is a folder; expected a file")
    return entry, storage.backend().iter_bytes(path, entry=entry)


def path_info(reader: Reader, path: str) -> Entry:
    access.check_read(reader, path)
    return storage.backend().require(path)


def path_delete(reader: Reader, path: str) -> None:
    access.check_delete(reader, path)
    if not storage.backend().delete(path, recursive=True):
        raise StorageNotFound(f"{path} does not exist")

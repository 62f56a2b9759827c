"""The one storage interface both backends implement.

Paths here are storage paths (see paths.py), already checked for access by
the caller; backends only make sure a path cannot leave their own root.
"""

from __future__ import annotations

import heapq
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from jobs.storage.errors import StorageError, StorageNotFound, source_unreadable

CHUNK = 1024 * 1024
CODE_FOLDER = "a code folder"  # what download_tree's limit is for, unless told


# Temporary names (a streamed upload before it is moved into place, a local
# write before its rename): hidden from listings by every backend.
PARTIAL_PREFIX = ".pai-upload-"


@dataclass(frozen=True)
class Entry:
    """A file or folder: what a listing row and a stat show."""

    path: str
    is_dir: bool
    size: int
    modified: datetime | None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


# A folder listing's order: folders first, then by name, case folded (the
# name itself breaks ties, so the order is total and a key names one entry).
ListingKey = tuple[bool, str, str]


def listing_key(name: str, is_dir: bool) -> ListingKey:
    return (not is_dir, name.lower(), name)


@dataclass(frozen=True)
class Window:
    """Part of a folder's listing: `entries` in listing order, the first of
    them the `start`-th (1-based) of the `total` entries."""

    entries: list[Entry]
    total: int
    start: int


def window_of(keyed: Iterable[tuple[ListingKey, object]], *, after: ListingKey | None, before: ListingKey | None,
              limit: int) -> tuple[list[tuple[ListingKey, object]], int, int]:
    """One pass over a folder's (key, item) pairs, holding no more than
    `limit` of them whatever the folder's size: the `limit` first after
    `after`, or the `limit` last before `before` (else the first), with the
    total and the 1-based position of the first one kept."""
    total = ahead = 0  # ahead: entries before the window's first

    def counted() -> Iterator[tuple[ListingKey, object]]:
        nonlocal total, ahead
        for pair in keyed:
            total += 1
            key = pair[0]
            if before is not None:
                if key < before:
                    ahead += 1
                    yield pair
            elif after is None or key > after:
                yield pair
            else:
                ahead += 1

    if before is not None:
        chosen = sorted(heapq.nlargest(limit, counted(), key=lambda pair: pair[0]), key=lambda pair: pair[0])
        ahead -= len(chosen)
    else:
        chosen = heapq.nsmallest(limit, counted(), key=lambda pair: pair[0])
    return chosen, total, ahead + 1


class Backend(ABC):
    """list, stat, read, write (streamed), mkdir, delete; trees on top."""

    label = "storage"

    @abstractmethod
    def stat(self, path: str) -> Entry | None:
        """The entry at `path`, or None when there is none."""

    @abstractmethod
    def list(self, path: str) -> list[Entry]:
        """A folder's entries (StorageNotFound / StorageError if not a folder)."""

    def list_window(self, path: str, *, keep: Callable[[str], bool], limit: int, after: ListingKey | None = None,
                    before: ListingKey | None = None) -> Window:
        """A page of a folder's listing (see window_of), of the entries whose
        path `keep` takes. Backends whose folders can be too big to hold
        whole override it to read them as a stream."""
        keyed = ((listing_key(entry.name, entry.is_dir), entry) for entry in self.list(path) if keep(entry.path))
        chosen, total, start = window_of(keyed, after=after, before=before, limit=limit)
        return Window([entry for _, entry in chosen], total, start)  # type: ignore[misc]

    @abstractmethod
    def _open(self, path: str) -> AbstractContextManager[BinaryIO]:
        """A readable binary stream of the file at `path` (open_read has
        checked that it is a file)."""

    @abstractmethod
    def _write(self, path: str, stream: BinaryIO, *, overwrite: bool) -> int:
        """Store `stream` at `path` (parents made) without holding it in
        memory; `write` has checked what is there."""

    @abstractmethod
    def mkdir(self, path: str) -> None:
        """Make a folder and its parents; fine if it exists."""

    @abstractmethod
    def delete(self, path: str, *, recursive: bool = False) -> bool:
        """Remove a file or folder; False when nothing was there."""

    @abstractmethod
    def write_new(self, path: str, pieces: Iterable[bytes | memoryview]) -> int:
        """Store the pieces as a new file at `path` (its folder exists, the
        name is fresh) as they come: a streamed upload. Returns its size. If
        the pieces or the storage fail, what was written is removed and the
        error raised."""

    @abstractmethod
    def rename(self, source: str, target: str, *, overwrite: bool) -> None:
        """Move the file `source` to `target` (its parents made); replace a
        file there only with `overwrite`."""

    # ------------------------------------------- storage that knows its users

    def as_user(self, name: str) -> Backend:
        """This storage with every request made as the user `name`, where the
        storage checks its users' permissions itself (HDFS: doas=<name>); the
        same backend where it does not (local disk)."""
        return self

    def make_home(self, path: str, *, owner: str) -> None:
        """Make a user's own top folder (/<user>, /Output/<user>), owned by
        `owner` and closed to others where the storage has owners; made by
        this (the portal's own) backend. Fine if it exists."""
        self.mkdir(path)

    # ------------------------------------------------------- built on the above

    def nearest(self, path: str) -> tuple[Entry | None, bool]:
        """The entry at `path`, or else at the nearest folder above it that
        has one (None if not even the root has), and whether it is `path`'s
        own. A stat per level, from `path` up; backends may do it in fewer."""
        entry = self.stat(path)
        own = entry is not None
        while entry is None and path != "/":
            path = posixpath.dirname(path) or "/"
            entry = self.stat(path)
        return entry, own

    def require(self, path: str) -> Entry:
        entry = self.stat(path)
        if entry is None:
            raise StorageNotFound(f"{path} does not exist")
        return entry

    @contextmanager
    def open_read(self, path: str, *, entry: Entry | None = None) -> Iterator[BinaryIO]:
        """A readable binary stream of the file at `path`. Callers that have
        just looked the path up pass its `entry` to save asking again."""
        if entry is None:
            entry = self.require(path)
        if entry.is_dir:
            raise StorageError(f"{path} is a folder; expected a file")
        with self._open(path) as stream:
            yield stream

    def write(self, path: str, stream: BinaryIO, *, overwrite: bool = False) -> int:
        """Store `stream` at `path` (parents made) without holding it in memory."""
        existing = self.stat(path)
        if existing is not None and existing.is_dir:
            raise StorageError(f"{path} is a folder; a file cannot replace it")
        if existing is not None and not overwrite:
            raise StorageError(f"{path} already exists")
        return self._write(path, stream, overwrite=overwrite)

    def iter_bytes(self, path: str, *, entry: Entry | None = None, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """The file's content in chunks (for streamed downloads)."""
        with self.open_read(path, entry=entry) as stream:
            while chunk := stream.read(chunk_size):
                yield chunk

    def open_download(self, path: str, *, chunk_size: int = CHUNK) -> tuple[Entry, Iterator[bytes]]:
        """The file's entry and its content in chunks, for a streamed
        download (the entry gives the Content-Length). Backends that can
        learn the size from the read itself override this to save a stat."""
        entry = self.require(path)
        if entry.is_dir:
            raise StorageError(f"{path} is a folder; expected a file")
        return entry, self.iter_bytes(path, entry=entry, chunk_size=chunk_size)

    def walk(self, path: str) -> Iterator[tuple[str, Entry]]:
        """(relative path, entry) of every folder and file under a folder; a
        folder comes before what it holds."""
        for entry in sorted(self.list(path), key=lambda e: e.name):
            yield entry.name, entry
            if entry.is_dir:
                for relative, inner in self.walk(entry.path):
                    yield f"{entry.name}/{relative}", inner

    def usage(self, path: str) -> tuple[int, int]:
        """(bytes, files) under a folder; (0, 0) when it does not exist. For
        quotas (quota.py); backends answer it more cheaply where they can."""
        entry = self.stat(path)
        if entry is None:
            return 0, 0
        if not entry.is_dir:
            return entry.size, 1
        files = [inner for _relative, inner in self.walk(path) if not inner.is_dir]
        return sum(f.size for f in files), len(files)

    def download_tree(self, path: str, dest: Path, *, max_bytes: int, what: str = CODE_FOLDER) -> int:
        """Copy a folder into the local folder `dest`, refusing past max_bytes
        (the limit for `what`: a code folder, or dataDir)."""
        if not self.require(path).is_dir:
            raise StorageError(f"{path} is a file; expected a folder")
        dest.mkdir(parents=True, exist_ok=True)
        total = 0
        for relative, entry in self.walk(path):
            target = dest / relative
            if entry.is_dir:
                target.mkdir(parents=True, exist_ok=True)
                continue
            if total + entry.size > max_bytes:
                advice = "; keep code small and put data in dataDir" if what == CODE_FOLDER else ""
                raise StorageError(f"{path} holds more than {_megabytes(max_bytes)} (the limit for {what}){advice}")
            with self.open_read(entry.path, entry=entry) as source, open(target, "wb") as out:
                total += copy_limited(source, out, max_bytes - total, path, what=what)
        return total

    def upload_tree(self, src: Path, path: str, *, overwrite: bool = True) -> int:
        """Copy a local folder's contents into `path`. Symlinks are skipped:
        they could point anywhere on the host."""
        self.mkdir(path)
        total = 0
        for local in sorted(src.rglob("*")):
            if local.is_symlink():
                continue
            # A path relative to `src` has no "." or ".." parts: a plain join is normal.
            target = posixpath.join(path, local.relative_to(src).as_posix())
            if local.is_dir():
                self.mkdir(target)
            elif local.is_file():
                try:
                    stream = open(local, "rb")
                except OSError as exc:  # this machine's file, not the storage
                    raise source_unreadable(target, exc) from None
                with stream:
                    total += self.write(target, stream, overwrite=overwrite)
        return total


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):g} MB"


def copy_limited(source: BinaryIO, out: BinaryIO, limit: int, folder: str, *, what: str = CODE_FOLDER) -> int:
    """Copy until EOF; a file that grew since it was listed still cannot
    take the copy past the limit (for `what`)."""
    copied = 0
    while chunk := source.read(CHUNK):
        copied += len(chunk)
        if copied > limit:
            raise StorageError(f"{folder} grew past the limit for {what} while it was copied")
        out.write(chunk)
    return copied

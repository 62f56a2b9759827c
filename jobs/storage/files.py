"""What the storage page does for a signed-in user, with access checks.

Views call these and nothing below them; every function takes the Reader
(who is asking) and storage paths already located with `storage.locate`,
and works through `storage.backend_for(reader)`: on HDFS as that user.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from jobs import storage
from jobs.storage import access, paths, quota
from jobs.storage.access import Reader
from jobs.storage.base import PARTIAL_PREFIX, Backend, Entry, ListingKey, Window, listing_key
from jobs.storage.errors import StorageError, StorageNotFound
from jobs.storage.uploads import StagedFile, Staging


# Downloads go out in pieces this large: each piece is one hand-over from the
# view's thread to the event loop (portal/http_bridge.py), the part of a
# download that costs most when the machine is busy (bench/hdfs_transfer.py:
# 4 MB pieces took a third less of the worker's CPU than 256 KB ones). At most
# the bridge's send queue of them (10) waits per download for a slow client.
DOWNLOAD_CHUNK = 4 * 1024 * 1024


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
    entries: list[Entry]  # a page of them (PAGE_ENTRIES at most)
    crumbs: list[Crumb]
    may_write: bool
    may_create: bool  # missing, and the reader may make it
    total: int = 0  # entries in the folder
    start: int = 1  # the page's first is the start-th

    @property
    def parent(self) -> str | None:
        return None if self.path == paths.ROOT else paths.parent(self.path)

    @property
    def end(self) -> int:
        return self.start + len(self.entries) - 1

    @property
    def next_mark(self) -> str:
        """Where the next page starts after ("" on the last page)."""
        return place_mark(self.entries[-1]) if self.entries and self.end < self.total else ""

    @property
    def previous_mark(self) -> str:
        """Where the previous page ends before ("" on the first page)."""
        return place_mark(self.entries[0]) if self.entries and self.start > 1 else ""


# Entries a page of the storage page lists: a folder of a million files is
# read as a stream, and only a page of it is held and shown.
PAGE_ENTRIES = 1000


def place_mark(entry: Entry) -> str:
    """An entry's place in a listing, for a page link: d:<name> or f:<name>."""
    return ("d:" if entry.is_dir else "f:") + entry.name


def _listing_key(mark: str, field: str) -> ListingKey | None:
    if not mark:
        return None
    kind, _, name = mark.partition(":")
    if kind not in ("d", "f") or not name or "/" in name:
        raise StorageError(f"{field}: expected d:<folder name> or f:<file name>, got {mark[:80]!r}")
    return listing_key(name, kind == "d")


def home_of(reader: Reader) -> str:
    """Where the page opens: the home (made on first visit), else /Output/<user>."""
    home = reader.home if access.may_write(reader, reader.home) else reader.output_home
    storage.ensure_home(reader, home)
    return home


def crumbs(path: str) -> list[Crumb]:
    parts = [p for p in path.split("/") if p]
    return [Crumb("/", "/")] + [Crumb(name, "/" + "/".join(parts[: i + 1])) for i, name in enumerate(parts)]


def folder_open(reader: Reader, path: str, *, after: str = "", before: str = "") -> Folder:
    """A page of the folder at `path`: its first, or the one after the
    place mark `after`, or the one before `before` (Folder.next_mark and
    previous_mark)."""
    access.check_read(reader, path)
    after_key, before_key = _listing_key(after, "after"), _listing_key(before, "before")
    backend = storage.backend_for(reader)
    entry = backend.stat(path)
    if entry is not None and not entry.is_dir:
        raise StorageError(f"{path} is a file; download it instead")
    window = Window([], 0, 1) if entry is None else backend.list_window(
        path, keep=lambda inner: access.may_read(reader, inner), limit=PAGE_ENTRIES, after=after_key, before=before_key)
    writable = access.may_write(reader, path)
    return Folder(path=path, uri=storage.to_uri(path), exists=entry is not None, entries=window.entries,
                  crumbs=crumbs(path), may_write=writable and entry is not None, may_create=writable and entry is None,
                  total=window.total, start=window.start)


def _name(name: str, what: str) -> str:
    """A relative name typed or sent by the browser: no `..`, not empty, not
    deeper than a storage path may be. Refusals say which name it was."""
    try:
        relative = paths.normalize("/" + name.replace("\\", "/"), typed=name)
    except StorageError as exc:
        raise StorageError(f"the {what} name {exc}") from None
    if relative == paths.ROOT:
        raise StorageError(f"the {what} name is empty")
    # A path typed or linked is stripped of the spaces around it, so a name
    # ending in one could be stored but never downloaded or deleted.
    if any(part != part.strip() for part in relative.split("/")):
        raise StorageError(f'the {what} name "{name}" has a part that starts or ends with a space')
    return relative.lstrip("/")


def folder_create(reader: Reader, folder: str, name: str) -> str:
    path = paths.join(folder, _name(name, "folder")) if name else folder
    access.check_write(reader, path)
    backend = storage.backend_for(reader)
    if backend.stat(path) is not None:
        raise StorageError(f"{path} already exists")
    storage.ensure_home(reader, path)
    backend.mkdir(path)  # fine when `path` is the home ensure_home just made
    return path


UPLOAD_STAGING = f"/{PARTIAL_PREFIX}staging"


def upload_staging(reader: Reader) -> Staging:
    """Where the files of one upload request are stored as they arrive:
    /.pai-upload-staging/<user>, made by the portal and owned by the user
    (0700 on HDFS), like a home. Outside the homes, so files not yet checked
    count against no quota; hidden from listings by its name. A user's
    upload may hold no more than the whole quota (whatever it replaces, no
    more can fit): the quota itself is checked as files_save moves them."""
    folder = f"{UPLOAD_STAGING}/{reader.name}"
    if storage.backend().stat(folder) is None:
        storage.backend().make_home(folder, owner=reader.name)
    limits = None if reader.is_admin else quota.limits()  # admins write to shared folders too: nobody's quota
    most = limits.bytes if limits is not None and limits.bytes else None
    return Staging(store=storage.backend_for(reader), folder=folder, max_bytes=most)


def files_save(reader: Reader, folder: str, items: list[tuple[str, StagedFile]], *, overwrite: bool) -> list[str]:
    """Move uploaded files (relative name, staged file) into `folder`.
    Checks every name, access and the quota first, so a refused upload
    stores nothing (the caller discards the staged files)."""
    access.check_write(reader, folder)
    targets = [(paths.join(folder, _name(relative, "file")), staged) for relative, staged in items]
    if not targets:
        raise StorageError("no files were sent")
    storage.ensure_home(reader, folder)
    backend = storage.backend_for(reader)
    _check_layout(backend, folder, [path for path, _ in targets])
    conflicts, existing = [], {}
    for path, _ in targets:
        access.check_write(reader, path)
        existing[path] = backend.stat(path)
        if existing[path] is not None and (existing[path].is_dir or not overwrite):
            conflicts.append(path)
    if conflicts:
        shown = ", ".join(conflicts[:5]) + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
        raise FileConflict(f"already there: {shown}; tick \"replace existing files\" to overwrite them")
    added = _check_quota(existing, targets)
    try:
        for path, staged in targets:
            backend.rename(staged.temp, path, overwrite=overwrite)
    except BaseException:
        # Cut short with some files in place (and the failed move maybe done
        # on HDFS without its answer): the kept usage no longer says what
        # is there, so the next check measures again.
        for owner in added:
            quota.forget(owner)
        raise
    for owner, (size, count) in added.items():
        quota.note_written(owner, added_bytes=size, added_files=count)
    return [path for path, _ in targets]


def _check_layout(backend: Backend, folder: str, targets: list[str]) -> None:
    """Refuse, before anything is moved, an upload whose files cannot all be
    put in place: a name given twice, a name that another needs as a folder,
    or an existing file standing where a folder must go. Each would have
    failed half-way, with the earlier files already stored."""
    seen: set[str] = set()
    for path in targets:
        if path in seen:
            raise StorageError(f"{path} is named twice in this upload")
        seen.add(path)
    folders: dict[str, bool] = {}  # each folder above a target: whether a file stands there (one stat each)
    for path in targets:
        above = paths.parent(path)
        while above != folder and above != paths.ROOT:
            if above not in folders:
                if above in seen:
                    raise StorageError(f"{above} is both a file and a folder in this upload")
                entry = backend.stat(above)
                folders[above] = entry is not None and not entry.is_dir
            if folders[above]:
                raise StorageError(f"{above} is a file, so {path} cannot go under it")
            above = paths.parent(above)


def _check_quota(existing: dict[str, Entry | None],
                 targets: list[tuple[str, StagedFile]]) -> dict[str | None, tuple[int, int]]:
    """What the upload adds per quota owner (a replaced file counts as the
    difference; `existing`: what is at each target now, as files_save just
    looked it up); raises StorageQuotaExceeded before anything is moved. The
    staged files are in the uploader's home meanwhile, but the quota cache
    has not counted them (they are moved or removed at once)."""
    added: dict[str | None, tuple[int, int]] = {}
    for path, staged in targets:
        there = existing[path]
        size, count = added.get(quota.owner_of(path), (0, 0))
        grows = staged.size - (there.size if there else 0)
        added[quota.owner_of(path)] = (size + grows, count + (there is None))
    for owner, (size, count) in added.items():
        quota.check_room(owner, adding_bytes=size, adding_files=count)
    return added


class FileConflict(StorageError):
    """An upload would replace files the user did not agree to replace."""


def file_read(reader: Reader, path: str) -> tuple[Entry, Iterator[bytes]]:
    """The file's entry and its content, no more of it than the entry's
    size: a download announces that size as its Content-Length, and a file
    that grew since (written in place outside the portal) must not make
    the answer longer than it said."""
    access.check_read(reader, path)
    entry, chunks = storage.backend_for(reader).open_download(path, chunk_size=DOWNLOAD_CHUNK)
    return entry, _AtMost(chunks, entry.size)


class _AtMost:
    """`chunks`, but no more than `size` bytes of them. A class and not a
    generator: closing it closes `chunks` (an open WebHDFS read) even when
    nothing was read yet (a refused or cancelled download), which a
    generator that never started does not."""

    def __init__(self, chunks: Iterator[bytes], size: int) -> None:
        self._chunks = iter(chunks)
        self._source = chunks
        self._left = size

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._left <= 0:
            self.close()  # the open file or HDFS read, at once
            raise StopIteration
        chunk = next(self._chunks)
        left, self._left = self._left, self._left - len(chunk)
        return chunk if len(chunk) <= left else chunk[:left]  # no copy but of the last

    def close(self) -> None:
        for thing in (self._chunks, self._source):
            close = getattr(thing, "close", None)
            if close is not None:
                close()


def path_info(reader: Reader, path: str) -> Entry:
    access.check_read(reader, path)
    return storage.backend_for(reader).require(path)


def path_delete(reader: Reader, path: str) -> None:
    access.check_delete(reader, path)
    try:
        if not storage.backend_for(reader).delete(path, recursive=True):
            raise StorageNotFound(f"{path} does not exist")
    finally:
        quota.forget(quota.owner_of(path))

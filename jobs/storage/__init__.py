"""Storage for code, data and output: the only package that imports `hdfs`.

Two backends behind one interface (base.Backend): local disk under
STORAGE_LOCAL_ROOT (the default; file:// URIs) and HDFS through WebHDFS
(hdfs:// URIs). registry.py finds the one STORAGE_BACKEND names (each backend
module registers its kind); paths.py says how users address files, access.py
who may touch what, files.py is what the storage page does for a signed-in
user. portal/settings.py imports this package, so nothing here may import
models or other Django app code at import time.

Used by the job services and the node runner (keep these names):

    StorageError, StorageAccessDenied, StorageNotFound, StorageUnavailable (try again later),
    StorageSourceUnreadable (what was to be written could not be read here)
    check_job_paths(*, user_name, is_admin, spec) -> [(field, message)]
    ensure_output_dir(*, uri, reader)
    stage_tree(uri, dest, *, max_bytes) -> bytes copied
    stage_data(uri, dest, *, max_bytes) -> (bytes, copied?)
    upload_tree(src, uri) -> bytes copied (within the owner's quota)
    room_at(uri) -> (bytes, files) the owner of uri may still store, or None
    read_small_file(uri, *, max_bytes) -> bytes
    parse_auth_file(data) -> (registry, username, password)

The runner-side functions take an optional `user_name`, needed only for paths
relative to the owner's home ("code" = "/<user>/code"); configs that use URIs
or absolute paths do not need it. They also take the `reader` they act for
(the job's owner): on HDFS their requests then run as that user
(`backend_for`), so HDFS's own permissions apply as well as the portal's.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from jobs.storage import paths, quota
from jobs.storage.access import Reader, check_read, check_write, may_write
from jobs.storage.base import Backend, Entry, copy_limited
from jobs.storage.errors import (StorageAccessDenied, StorageError, StorageNotFound, StorageQuotaExceeded,
                                 StorageSourceUnreadable, StorageUnavailable)
from jobs.storage.registry import storage_for_backend

if TYPE_CHECKING:
    from jobs.spec import JobSpec

__all__ = [
    "Backend", "Entry", "Reader", "StorageAccessDenied", "StorageError", "StorageNotFound", "StorageQuotaExceeded",
    "StorageSourceUnreadable", "StorageUnavailable",
    "backend", "backend_for", "canonical_uri", "check_job_paths", "ensure_home", "ensure_output_dir", "locate",
    "parse_auth_file",
    "read_small_file", "reader_for", "room_at", "stage_data", "stage_tree", "to_uri", "upload_tree",
]

_lock = threading.Lock()
_backends: dict[tuple, Backend] = {}


def backend() -> Backend:
    """The configured backend (one per configuration, made on first use)."""
    kind = storage_for_backend(settings.STORAGE_BACKEND)
    values = kind.settings_of(settings)
    key = (kind.scheme, *values.values())
    with _lock:
        if key not in _backends:
            _backends[key] = kind.make(values)
        return _backends[key]


def backend_for(reader: Reader | None) -> Backend:
    """The backend acting for `reader`: on HDFS its requests run as that user
    (doas), so HDFS refuses what its permissions refuse. Admins, and the
    portal itself (None), act as the service user."""
    if reader is None or reader.is_admin:
        return backend()
    return backend().as_user(reader.name)


def ensure_home(reader: Reader, path: str) -> None:
    """Make the reader's own top folder that `path` lies in (/<user> or
    /Output/<user>) when missing: users cannot make folders at the top, so
    the portal makes these for them, owned by them (Backend.make_home)."""
    for top in (reader.home, reader.output_home):
        if (path == top or path.startswith(top + "/")) and may_write(reader, top) and backend().stat(top) is None:
            backend().make_home(top, owner=reader.name)


def locate(value: str, *, user_name: str | None = None) -> str:
    """The storage path a user means (URI, absolute or home-relative path)."""
    return paths.to_path(value, backend=settings.STORAGE_BACKEND, default_fs_uri=settings.PAI_DEFAULT_FS_URI,
                         user_name=user_name)


def to_uri(path: str) -> str:
    """The URI for a storage path, as a job config would name it."""
    return paths.to_uri(path, backend=settings.STORAGE_BACKEND, default_fs_uri=settings.PAI_DEFAULT_FS_URI)


def canonical_uri(value: str, *, user_name: str) -> str:
    """`value` as a full URI ("code" -> "file:///alice/code"), for places
    that pass paths on without a user at hand (a task's PAI_DATA_DIR, the
    node runner). A value that cannot be located is returned unchanged:
    submission has already reported it."""
    if not value:
        return value
    try:
        return to_uri(locate(value, user_name=user_name))
    except StorageError:
        return value


def reader_for(*, user_name: str, is_admin: bool) -> Reader:
    return Reader(name=user_name, is_admin=is_admin, shared=tuple(settings.STORAGE_SHARED_FOLDERS))


# ------------------------------------------------------------------ submission

def check_job_paths(*, user_name: str, is_admin: bool, spec: JobSpec) -> list[tuple[str, str]]:
    """(field, message) for each of codeDir, dataDir, outputDir, authFile the
    user may not use. codeDir must be an existing folder and authFile a valid
    file now, and nothing may stand where outputDir's folders go: finding out
    when the task starts, maybe hours later, helps nobody. Messages say what
    was expected (the errors below are worded that way)."""
    reader = reader_for(user_name=user_name, is_admin=is_admin)
    fields = [("codeDir", spec.code_dir, False), ("dataDir", spec.data_dir, False),
              ("outputDir", spec.output_dir, True), ("authFile", spec.auth_file, False)]
    problems = []
    for field, value, write in fields:
        if not value:
            continue
        path = value
        try:
            path = locate(value, user_name=user_name)
            (check_write if write else check_read)(reader, path)
            if field == "codeDir":
                _check_folder(path, store=backend_for(reader))
            elif field == "outputDir":
                _check_output_folder(path, store=backend_for(reader))
            elif field == "authFile":
                parse_auth_file(_read_limited(path, max_bytes=64 * 1024, store=backend_for(reader)))
        except StorageNotFound:
            problems.append((field, f"{to_uri(path)} does not exist; expected {_EXPECTED[field]}"))
        except StorageError as exc:
            problems.append((field, str(exc)))
    return problems


_EXPECTED = {"codeDir": "an existing folder", "authFile": "a file of three lines: registry, username, password"}


def _check_folder(path: str, *, store: Backend) -> None:
    if not store.require(path).is_dir:
        raise StorageError(f"{to_uri(path)} is a file; expected a folder")
    store.list(path)  # the node will list it as the job's owner: HDFS may refuse that where a stat passes


def _check_output_folder(path: str, *, store: Backend) -> None:
    """outputDir can be made (ensure_output_dir, as a task starts): it is a
    folder, or it is missing and the nearest thing above it is a folder.
    Only looked at: making it here cost a new inode per submission, a tenth
    of a submission's CPU (perf of bench/api_submit_rate.py's web workers),
    for a job that may never start."""
    entry, own = store.nearest(path)
    if entry is not None and not entry.is_dir:
        above = "" if own else ", since outputDir goes inside it"
        raise StorageError(f"{to_uri(entry.path)} is a file; expected a folder{above}")


def ensure_output_dir(*, uri: str, reader: Reader) -> None:
    """Make outputDir when missing, as `reader` (the job's owner), before a
    task of the job starts: its code may write there (PAI_OUTPUT_DIR).
    Submission checked that nothing stands in the way; access is checked
    again (`_acting_as`)."""
    path = locate(uri, user_name=reader.name)
    _acting_as(reader, path, write=True)
    ensure_home(reader, path)
    store = backend_for(reader)
    entry = store.stat(path)
    if entry is not None and not entry.is_dir:
        raise StorageError(f"{to_uri(path)} is a file; expected a folder")
    if entry is None:
        store.mkdir(path)


# ------------------------------------------------------------------- the node

def _acting_as(reader: Reader | None, path: str, *, write: bool = False) -> None:
    """Check the portal's access rules for the job's owner (`reader`, None:
    the portal itself) again as the node reads or writes for a job:
    submission checked them, but an admin who submitted may have lost the
    right since (HDFS checks its own permissions too; local disk none)."""
    if reader is not None:
        (check_write if write else check_read)(reader, path)


def stage_tree(uri: str, dest: Path, *, max_bytes: int, user_name: str | None = None,
               reader: Reader | None = None) -> int:
    """Copy the folder at `uri` into the local folder `dest` (the node's code
    cache). With local storage the node reads STORAGE_LOCAL_ROOT directly:
    portal and nodes share one machine."""
    path = locate(uri, user_name=user_name)
    _acting_as(reader, path)
    return backend_for(reader).download_tree(path, dest, max_bytes=max_bytes)


def stage_data(uri: str, dest: Path, *, max_bytes: int, user_name: str | None = None,
               reader: Reader | None = None) -> tuple[int, bool]:
    """Copy dataDir (a folder's contents, or one file) into the local folder
    `dest` when it holds at most `max_bytes`: (bytes, True). A bigger one is
    not copied: (its size, False). StorageNotFound when it is missing."""
    store = backend_for(reader)
    path = locate(uri, user_name=user_name)
    _acting_as(reader, path)
    entry = store.require(path)
    size = store.usage(path)[0] if entry.is_dir else entry.size  # one request on HDFS (content summary)
    if size > max_bytes:
        return size, False
    if entry.is_dir:
        return store.download_tree(path, dest, max_bytes=max_bytes, what="dataDir"), True
    dest.mkdir(parents=True, exist_ok=True)
    with store.open_read(path, entry=entry) as source, open(dest / entry.name, "wb") as out:
        # Appended to since it was looked at: still no further than the limit.
        return copy_limited(source, out, max_bytes, to_uri(path), what="dataDir"), True


def upload_tree(src: Path, uri: str, *, user_name: str | None = None, reader: Reader | None = None) -> int:
    """Copy a local folder's contents into `uri` (made when missing), if it
    fits in the quota of the user whose folder that is (else
    StorageQuotaExceeded, and nothing is copied). So is a tree deeper
    than a storage path may be, which a task's output can be: every target
    is checked (paths.join) before anything is copied."""
    path = locate(uri, user_name=user_name)
    _acting_as(reader, path, write=True)
    owner = quota.owner_of(path)
    entries = [f for f in src.rglob("*") if not f.is_symlink()]
    for entry in entries:
        paths.join(path, entry.relative_to(src).as_posix())
    files = [f for f in entries if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    quota.check_room(owner, adding_bytes=size, adding_files=len(files))
    if reader is not None:
        ensure_home(reader, path)
    try:
        copied = backend_for(reader).upload_tree(src, path)
    except BaseException:
        quota.forget(owner)  # cut short with some files copied: measured again at the next check
        raise
    quota.note_written(owner, added_bytes=copied, added_files=len(files))
    return copied


def room_at(uri: str, *, user_name: str | None = None) -> tuple[int, int] | None:
    """(bytes, files) the owner of `uri` may still store; None: no quota."""
    room = quota.room_for(quota.owner_of(locate(uri, user_name=user_name)))
    return None if room is None else (room.bytes, room.files)


def read_small_file(uri: str, *, max_bytes: int, user_name: str | None = None, reader: Reader | None = None) -> bytes:
    path = locate(uri, user_name=user_name)
    _acting_as(reader, path)
    return _read_limited(path, max_bytes=max_bytes, store=backend_for(reader))


def _read_limited(path: str, *, max_bytes: int, store: Backend) -> bytes:
    entry = store.require(path)
    if entry.is_dir:
        raise StorageError(f"{to_uri(path)} is a folder; expected a file")
    if entry.size > max_bytes:
        raise StorageError(f"{to_uri(path)} is larger than {max_bytes} bytes")
    with store.open_read(path, entry=entry) as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StorageError(f"{to_uri(path)} is larger than {max_bytes} bytes")
    return data


def parse_auth_file(data: bytes) -> tuple[str, str, str]:
    """OpenPAI's authFile: registry, username and password on three lines.
    Errors never quote the file: its third line is a password."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StorageError("the authFile is not UTF-8 text") from None
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) != 3 or not all(lines):
        raise StorageError(f"the authFile has {len(lines)} non-blank line(s) where three were expected: "
                           "registry, username, password")
    registry, username, password = lines
    return registry, username, password

"""Local-disk storage: a folder on this machine (STORAGE_LOCAL_ROOT).

The storage path "/alice/code" is ROOT/alice/code. Nothing may lead out of
the root: `..` never reaches here (paths.normalize refuses it), symlinks are
not listed, followed or copied, and every path is resolved and checked to
stay under the root before it is touched.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat as stat_module
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from jobs.storage.base import CHUNK, PARTIAL_PREFIX, Backend, Entry, ListingKey, Window, listing_key, window_of
from jobs.storage.errors import StorageAccessDenied, StorageError, StorageNotFound, source_unreadable
from jobs.storage.paths import join
from jobs.storage.registry import StorageKind, register_storage

FILE_MODE = 0o640
FOLDER_MODE = 0o750


class LocalBackend(Backend):
    label = "local disk"

    def __init__(self, root: Path) -> None:
        root.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        self.root = root.resolve()
        self._root = str(self.root)
        self._inside = self._root.rstrip("/") + "/"

    def _real(self, path: str) -> Path:
        resolved = self._resolve([p for p in path.split("/") if p])
        if resolved != self._root and not resolved.startswith(self._inside):
            raise StorageAccessDenied(f"{path} leads outside the storage folder")
        return Path(resolved)

    def _resolve(self, parts: list[str]) -> str:
        """ROOT/parts with every symlink resolved, as os.path.realpath would,
        but looking only at the parts below the root (resolved once, at
        start): a submission resolves a few paths, and realpath's walk from
        "/" was most of its storage check. Nothing below a missing part
        exists; a symlink hands the rest to realpath, checked by the caller."""
        if "." in parts or ".." in parts:  # paths.normalize keeps these out; realpath if one slips by
            return os.path.realpath(os.path.join(self._root, *parts))
        current = self._root
        for i, part in enumerate(parts):
            candidate = os.path.join(current, part)
            try:
                mode = os.lstat(candidate).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return os.path.join(candidate, *parts[i + 1:])
            except OSError:
                return os.path.realpath(os.path.join(candidate, *parts[i + 1:]))
            if stat_module.S_ISLNK(mode):
                return os.path.realpath(os.path.join(candidate, *parts[i + 1:]))
            current = candidate
        return current

    def _entry(self, path: str, real: Path) -> Entry | None:
        try:
            info = real.lstat()
        except (FileNotFoundError, NotADirectoryError):  # nothing exists below a file
            return None
        except OSError as exc:
            raise _error(path, exc) from None
        if not (stat_module.S_ISDIR(info.st_mode) or stat_module.S_ISREG(info.st_mode)):
            return None  # symlinks, sockets, fifos: not ours to show
        return Entry(
            path=path, is_dir=stat_module.S_ISDIR(info.st_mode),
            size=0 if stat_module.S_ISDIR(info.st_mode) else info.st_size,
            modified=datetime.fromtimestamp(info.st_mtime, tz=UTC),
        )

    def stat(self, path: str) -> Entry | None:
        return self._entry(path, self._real(path))

    def nearest(self, path: str) -> tuple[Entry | None, bool]:
        """One walk down from the root, where a stat per level up from
        `path` resolved the whole path again at every level: outputDir's
        check on each submission (jobs/storage/__init__.py) took seven
        lstat calls for a new user's first folders. Anything unusual on the
        way (a symlink, `..`, a socket) goes the long way, as before."""
        parts = [p for p in path.split("/") if p]
        if "." in parts or ".." in parts:
            return super().nearest(path)
        current, depth = self._root, 0
        for part in parts:
            candidate = os.path.join(current, part)
            try:
                mode = os.lstat(candidate).st_mode
            except (FileNotFoundError, NotADirectoryError):
                break
            except OSError:
                return super().nearest(path)
            if stat_module.S_ISLNK(mode):
                return super().nearest(path)
            current, depth = candidate, depth + 1
        entry = self._entry("/" + "/".join(parts[:depth]), Path(current))
        if entry is None:  # neither a file nor a folder: what lies above is looked at as stat would
            return super().nearest(path)
        return entry, depth == len(parts)

    def list(self, path: str) -> list[Entry]:
        real = self._real(path)
        with _folder_errors(path):
            names = sorted(os.listdir(real))
        entries = (self._entry(join(path, name), real / name) for name in names if not name.startswith(PARTIAL_PREFIX))
        return [entry for entry in entries if entry is not None]

    def list_window(self, path: str, *, keep: Callable[[str], bool], limit: int, after: ListingKey | None = None,
                    before: ListingKey | None = None) -> Window:
        """Read as a stream (os.scandir): a folder of a million files holds
        only the window's names in memory, and only they are stat'ed."""
        real = self._real(path)
        with _folder_errors(path), os.scandir(real) as scanner:
            keyed = ((listing_key(item.name, is_dir), item.name) for item, is_dir in _plain_entries(scanner)
                     if not item.name.startswith(PARTIAL_PREFIX) and keep(join(path, item.name)))
            chosen, total, start = window_of(keyed, after=after, before=before, limit=limit)
        entries = (self._entry(join(path, name), real / name) for _, name in chosen)  # type: ignore[misc]
        return Window([entry for entry in entries if entry is not None], total, start)  # removed meanwhile: left out

    @contextmanager
    def _open(self, path: str) -> Iterator[BinaryIO]:
        with self._open_file(path) as stream:
            yield stream

    def _open_file(self, path: str) -> BinaryIO:
        try:
            return open(self._real(path), "rb")
        except FileNotFoundError:  # removed since it was looked up
            raise StorageNotFound(f"{path} does not exist") from None
        except IsADirectoryError:  # made a folder since
            raise StorageError(f"{path} is a folder; expected a file") from None
        except OSError as exc:
            raise _error(path, exc) from None

    def open_download(self, path: str, *, chunk_size: int = CHUNK) -> tuple[Entry, Iterator[bytes]]:
        """The file is opened now and its size is that of what was opened: a
        file replaced (moved into place whole) before the client reads a
        byte still goes out whole as it was, not the new one cut to the old
        one's length."""
        entry = self.require(path)  # a folder, a fifo or nothing is refused before anything is opened
        if entry.is_dir:
            raise StorageError(f"{path} is a folder; expected a file")
        stream = self._open_file(path)
        size = os.fstat(stream.fileno()).st_size
        return dataclasses.replace(entry, size=size), _Chunks(stream, chunk_size)

    def _write(self, path: str, stream: BinaryIO, *, overwrite: bool) -> int:
        real = self._real(path)
        self.mkdir(path.rsplit("/", 1)[0] or "/")
        # Write beside the target, then move it in whole: readers never see
        # half a file, and a failed upload leaves the old one in place.
        fd, temp = tempfile.mkstemp(prefix=PARTIAL_PREFIX, dir=real.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                size = 0
                while chunk := _read_source(stream, path):
                    out.write(chunk)
                    size += len(chunk)
            # Users' files are the portal's alone (finding 12); the staged copy
            # a container reads is made readable by the node (staging.py).
            os.chmod(temp, FILE_MODE)
            if overwrite:
                os.replace(temp, real)
            else:
                os.link(temp, real)  # fails if someone made it meanwhile
        except FileExistsError:
            raise StorageError(f"{path} already exists") from None
        except OSError as exc:
            raise _error(path, exc) from None
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        return size

    def write_new(self, path: str, pieces: Iterable[bytes | memoryview]) -> int:
        real = self._real(path)
        try:
            out = open(real, "xb")
        except OSError as exc:
            raise _error(path, exc) from None
        size = 0
        try:
            with out:
                for piece in pieces:
                    out.write(piece)
                    size += len(piece)
            os.chmod(real, FILE_MODE)
        except BaseException as exc:  # the pieces failed (a broken upload) or the disk did
            real.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise _error(path, exc) from None
            raise
        return size

    def rename(self, source: str, target: str, *, overwrite: bool) -> None:
        real_source, real_target = self._real(source), self._real(target)
        self.mkdir(target.rsplit("/", 1)[0] or "/")
        try:
            if real_target.is_dir():
                raise StorageError(f"{target} is a folder; a file cannot replace it")
            if overwrite:
                os.replace(real_source, real_target)
            else:
                os.link(real_source, real_target)  # fails if someone made it meanwhile
                os.unlink(real_source)
        except FileExistsError:
            raise StorageError(f"{target} already exists") from None
        except OSError as exc:
            raise _error(target, exc) from None

    def usage(self, path: str) -> tuple[int, int]:
        """One walk with os.scandir (no symlinks followed), summing sizes."""
        total = files = 0
        pending = [self._real(path)]
        while pending:
            try:
                with os.scandir(pending.pop()) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                            files += 1
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone meanwhile, or the path is a file (not a home)
        return total, files

    def mkdir(self, path: str) -> None:
        real = self._real(path)
        try:
            real.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StorageError(f"cannot make folder {path}: a file is in the way") from None
        except OSError as exc:
            raise _error(path, exc) from None

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        real = self._real(path)
        entry = self._entry(path, real)
        if entry is None:
            return False
        if real == self.root:
            raise StorageAccessDenied("the storage root cannot be deleted")
        try:
            if not entry.is_dir:
                real.unlink()
            elif recursive:
                shutil.rmtree(real)
            else:
                real.rmdir()
        except OSError as exc:
            if entry.is_dir and not recursive and any(real.iterdir()):
                raise StorageError(f"{path} is not empty") from None
            raise _error(path, exc) from None
        return True


@contextmanager
def _folder_errors(path: str) -> Iterator[None]:
    """Reading the folder `path`: OS errors as storage errors."""
    try:
        yield
    except FileNotFoundError:
        raise StorageNotFound(f"{path} does not exist") from None
    except NotADirectoryError:
        raise StorageError(f"{path} is a file; expected a folder") from None
    except OSError as exc:
        raise _error(path, exc) from None


def _plain_entries(scanner: Iterator[os.DirEntry]) -> Iterator[tuple[os.DirEntry, bool]]:
    """Folders and regular files (whether each is a folder), as `list`
    shows them: symlinks, sockets and fifos are not ours to show."""
    for item in scanner:
        try:
            if item.is_dir(follow_symlinks=False):
                yield item, True
            elif item.is_file(follow_symlinks=False):
                yield item, False
        except OSError:
            continue  # removed meanwhile


class _Chunks:
    """An open file's content in chunks. A class and not a generator:
    closing it closes the file even when nothing was read yet (a refused
    or cancelled download)."""

    def __init__(self, stream: BinaryIO, chunk_size: int) -> None:
        self._stream, self._chunk_size = stream, chunk_size

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._stream.read(self._chunk_size):
            yield chunk

    def close(self) -> None:
        self._stream.close()


def _read_source(stream: BinaryIO, path: str) -> bytes:
    """A chunk of what is written to `path`. Its read errors are not the
    storage folder's: told as the disk's, a source file the node could not
    read read as "the storage folder refuses access"."""
    try:
        return stream.read(CHUNK)
    except OSError as exc:
        raise source_unreadable(path, exc) from None


def _error(path: str, exc: OSError) -> StorageError:
    if isinstance(exc, PermissionError):
        return StorageAccessDenied(f"the storage folder refuses access to {path}")
    return StorageError(f"{path}: {exc.strerror or exc}")


register_storage(StorageKind(
    scheme="file", backend="local", label=LocalBackend.label, where="on its own disk", names_host=False,
    default_fs_uri="file://", fs_uri_hint="file:// (or leave it empty)",
    settings=("STORAGE_LOCAL_ROOT",), make=lambda values: LocalBackend(Path(values["STORAGE_LOCAL_ROOT"])),
))

"""HDFS through WebHDFS (HdfsCLI's InsecureClient): the only module that
imports `hdfs`.

Every request carries user.name=WEBHDFS_USER (simple authentication); the
portal's own access rules (access.py) decide what each portal user may touch,
and HDFS permissions apply to that one service user. Kerberos (SPNEGO) and
delegation tokens are not supported.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, BinaryIO

import requests
from hdfs import HdfsError, InsecureClient

from jobs.storage.base import Backend, Entry
from jobs.storage.errors import StorageAccessDenied, StorageError, StorageNotFound
from jobs.storage.paths import join

# (connect, read) seconds: a namenode that does not answer must not hang a
# page or a task start for minutes.
TIMEOUT = (5, 120)


class WebHdfsBackend(Backend):
    label = "HDFS"

    def __init__(self, url: str, *, user: str) -> None:
        self.url = url
        self.client = InsecureClient(url, user=user, timeout=TIMEOUT)

    @contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """HDFS's RemoteException names -> our errors, worded for users."""
        try:
            yield
        except HdfsError as exc:
            raise _translate(path, exc) from None
        except requests.RequestException as exc:
            raise StorageError(f"HDFS at {self.url} did not answer ({type(exc).__name__})") from None

    def stat(self, path: str) -> Entry | None:
        with self._errors(path):
            status = self.client.status(path, strict=False)
        return None if status is None else _entry(path, status)

    def list(self, path: str) -> list[Entry]:
        with self._errors(path):
            try:
                statuses = self.client.list(path, status=True)
            except HdfsError as exc:
                # HdfsCLI's own error for a file (a file lists itself in
                # LISTSTATUS); a missing path is HDFS's FileNotFoundException.
                if exc.exception is None and "is not a directory" in exc.message:
                    raise StorageError(f"{path} is a file; expected a folder") from None
                raise
        return [_entry(join(path, name), status) for name, status in statuses]

    @contextmanager
    def _open(self, path: str) -> Iterator[BinaryIO]:
        with self._errors(path), self.client.read(path) as stream:
            yield stream

    def _write(self, path: str, stream: BinaryIO, *, overwrite: bool) -> int:
        with self._errors(path):
            self.client.write(path, data=_body(stream), overwrite=overwrite)
            status = self.client.status(path)
        return int(status["length"])

    def mkdir(self, path: str) -> None:
        with self._errors(path):
            self.client.makedirs(path)

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        if path == "/":
            raise StorageAccessDenied("the HDFS root cannot be deleted")
        with self._errors(path):
            return bool(self.client.delete(path, recursive=recursive))


def _body(stream: BinaryIO) -> Any:
    """What requests should send. A file of known size goes as it is (read in
    blocks, with a Content-Length); anything else goes chunk by chunk with
    chunked transfer encoding. Either way nothing is held in memory whole."""
    if hasattr(stream, "__len__"):  # Django's uploaded files
        return stream
    try:
        os.fstat(stream.fileno())
        return stream
    except (AttributeError, OSError, io.UnsupportedOperation):
        return _Body(stream)


class _Body:
    """Iterating yields fixed-size chunks (a binary file's own iterator
    yields "lines", which may be the whole file)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._stream.read(1024 * 1024):
            yield chunk


def _entry(path: str, status: dict[str, Any]) -> Entry:
    modified = status.get("modificationTime")
    return Entry(
        path=path, is_dir=status.get("type") == "DIRECTORY",
        size=int(status.get("length", 0)) if status.get("type") != "DIRECTORY" else 0,
        modified=datetime.fromtimestamp(modified / 1000, tz=UTC) if modified else None,
    )


def _translate(path: str, exc: HdfsError) -> StorageError:
    kind = getattr(exc, "exception", None) or ""
    if kind == "FileNotFoundException":
        return StorageNotFound(f"{path} does not exist")
    if kind in ("AccessControlException", "SecurityException") or "Authentication failure" in str(exc):
        return StorageAccessDenied(f"HDFS refuses access to {path}: {exc.message}")
    if kind == "FileAlreadyExistsException":
        return StorageError(f"{path} already exists")
    if kind == "ParentNotDirectoryException":
        return StorageError(f"{path}: a file is in the way ({exc.message})")
    if kind == "PathIsNotEmptyDirectoryException":
        return StorageError(f"{path} is not empty")
    return StorageError(f"HDFS could not handle {path}: {exc.message}")

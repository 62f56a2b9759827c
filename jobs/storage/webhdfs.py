"""HDFS through WebHDFS (HdfsCLI's InsecureClient): the only module that
imports `hdfs`.

Every request carries user.name=WEBHDFS_USER (simple authentication), the
portal's service user. What a portal user does runs as that user: the
portal is a Hadoop proxy user and adds doas=<user> (as_user), so HDFS
checks its own permissions too, beside the portal's rules (access.py).
Homes are made by the service user, which must be an HDFS superuser to give
them to their users (make_home). Portal admins act as the service user.
Kerberos (SPNEGO) and delegation tokens are not supported.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import requests
from hdfs import HdfsError, InsecureClient
from hdfs.client import _Request
from requests.adapters import HTTPAdapter

from jobs.storage.base import CHUNK, PARTIAL_PREFIX, Backend, Entry, ListingKey, Window, listing_key, window_of
from jobs.storage.errors import (StorageAccessDenied, StorageError, StorageNotFound, StorageQuotaExceeded,
                                 StorageUnavailable, source_unreadable)
from jobs.storage.paths import ROOT, join, parent
from jobs.storage.registry import StorageKind, register_storage

# (connect, read) seconds: a namenode that does not answer must not hang a
# page or a task start for minutes.
TIMEOUT = (5, 120)
# HdfsCLI has no call for it (its list() is one LISTSTATUS, the whole folder
# in one answer); its own request helper makes one, with the same retries.
_list_status_batch = _Request("GET").to_method("LISTSTATUS_BATCH")


class WebHdfsBackend(Backend):
    label = "HDFS"

    def __init__(self, url: str, *, user: str, doas: str | None = None, adapter: HTTPAdapter | None = None) -> None:
        self.url, self.user, self.doas = url, user, doas
        # One connection pool for the service user and everyone it acts for.
        self._adapter = adapter or HTTPAdapter(pool_connections=4, pool_maxsize=32)
        session = requests.Session()
        session.mount("http://", self._adapter)
        session.mount("https://", self._adapter)
        # HdfsCLI adds user.name to these params; requests send them on every
        # request, the datanode's after the namenode's redirect too.
        session.params = {"doas": doas} if doas else {}
        self.client = InsecureClient(url, user=user, timeout=TIMEOUT, session=session)
        self._acting: dict[str, WebHdfsBackend] = {}
        self._acting_lock = threading.Lock()

    def as_user(self, name: str) -> WebHdfsBackend:
        if self.doas is not None:
            raise ValueError("as_user is asked of the service user's backend")
        if name == self.user:
            # doas=<service user> would give a portal user its superuser rights.
            raise StorageAccessDenied(f"the portal user {name} has the name of the HDFS service user (WEBHDFS_USER) "
                                      "and cannot use HDFS; an admin must rename one of them")
        with self._acting_lock:
            if name not in self._acting:
                self._acting[name] = WebHdfsBackend(self.url, user=self.user, doas=name, adapter=self._adapter)
            return self._acting[name]

    def make_home(self, path: str, *, owner: str) -> None:
        """Made by the service user, then given to `owner` (SETOWNER needs an
        HDFS superuser), 0700. Its parent (/Output) is made first with the
        usual 0755: made implicitly it would get 0700 as well."""
        with self._errors(path):
            if self.client.status(path, strict=False) is not None:
                return
            if parent(path) != ROOT:
                self.client.makedirs(parent(path))
            self.client.makedirs(path, permission="700")
            self.client.set_owner(path, owner=owner)

    @contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """HDFS's RemoteException names -> our errors, worded for users."""
        try:
            yield
        except HdfsError as exc:
            raise _translate(path, exc) from None
        except requests.RequestException as exc:
            raise StorageUnavailable(f"HDFS at {self.url} did not answer ({type(exc).__name__})") from None

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
        return [_entry(join(path, name), status) for name, status in statuses if not name.startswith(PARTIAL_PREFIX)]

    def list_window(self, path: str, *, keep: Callable[[str], bool], limit: int, after: ListingKey | None = None,
                    before: ListingKey | None = None) -> Window:
        """Read in the namenode's batches (LISTSTATUS_BATCH, dfs.ls.limit
        entries each): a folder of a million files is never one answer,
        and only the window's entries are held."""
        keyed = ((listing_key(status["pathSuffix"], status.get("type") == "DIRECTORY"), status)
                 for status in self._statuses(path)
                 if not status["pathSuffix"].startswith(PARTIAL_PREFIX) and keep(join(path, status["pathSuffix"])))
        chosen, total, start = window_of(keyed, after=after, before=before, limit=limit)
        return Window([_entry(join(path, status["pathSuffix"]), status) for _, status in chosen],  # type: ignore[index]
                      total, start)

    def _statuses(self, path: str) -> Iterator[dict[str, Any]]:
        after: str | None = None
        while True:
            with self._errors(path):
                body = _list_status_batch(self.client, path, **({"startAfter": after} if after is not None else {}))
                listing = body.json()["DirectoryListing"]
            statuses = listing["partialListing"]["FileStatuses"]["FileStatus"]
            for status in statuses:
                if not status.get("pathSuffix"):  # a file lists itself
                    raise StorageError(f"{path} is a file; expected a folder")
                yield status
            if not statuses or not listing.get("remainingEntries"):
                return
            after = statuses[-1]["pathSuffix"]

    @contextmanager
    def _open(self, path: str) -> Iterator[BinaryIO]:
        with self._errors(path), self.client.read(path) as stream:
            yield stream

    def iter_bytes(self, path: str, *, entry: Entry | None = None, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """Straight from the datanode's response: WebHDFS sends no content
        encoding, so urllib3's decoding buffer is skipped."""
        with self.open_read(path, entry=entry) as stream:
            while chunk := stream.read(chunk_size, decode_content=False):
                yield chunk

    def open_download(self, path: str, *, chunk_size: int = CHUNK) -> tuple[Entry, Iterator[bytes]]:
        """One OPEN, with no GETFILESTATUS before it: the namenode looks the
        path up for the OPEN anyway, and the datanode's answer carries the
        length. The stream is open before the response starts, so a refusal
        is an error page, not a cut-off download."""
        with self._errors(path):
            try:
                # HdfsCLI's read() hides the response, and with it the length.
                response = self.client._open(path, offset=0)
            except HdfsError as exc:
                # HDFS answers a folder with FileNotFoundException ("Path is not a file").
                if getattr(exc, "exception", None) == "FileNotFoundException":
                    entry = self.stat(path)
                    if entry is not None and entry.is_dir:
                        raise StorageError(f"{path} is a folder; expected a file") from None
                raise
        try:
            length = response.headers.get("Content-Length")
            size = int(length) if length is not None else self.require(path).size
        except BaseException:
            response.close()
            raise
        return Entry(path=path, is_dir=False, size=size, modified=None), _Download(response, chunk_size)

    def _write(self, path: str, stream: BinaryIO, *, overwrite: bool) -> int:
        """Written beside the target under a hidden name, then renamed over
        it (rename2, atomic), as on local disk: a CREATE with overwrite
        empties the old file at once, so a write that failed midway left
        half of the new file where the old one was, and readers saw it."""
        temp = join(parent(path), f"{PARTIAL_PREFIX}{secrets.token_hex(12)}")
        size = self._create(temp, _Body(stream), named=path)
        try:
            self.rename(temp, path, overwrite=overwrite)
        except BaseException:
            try:
                self.delete(temp)
            except StorageError:
                pass  # HDFS unreachable: a hidden partial file stays behind (listings skip it)
            raise
        return size

    def write_new(self, path: str, pieces: Iterable[bytes | memoryview]) -> int:
        """One CREATE whose body is the pieces, sent as they come: the upload
        reaches the datanode as it arrives, never spooled."""
        return self._create(path, pieces, named=path)

    def _create(self, path: str, pieces: Iterable[bytes | memoryview], *, named: str) -> int:
        """`write_new`; errors name the file as `named` (the target of a
        write that goes under a hidden name first)."""
        counted = _Counted(pieces)
        someone_elses = False
        try:
            with self._errors(path):
                try:
                    if self.url.startswith("http://"):
                        location = self.client._create(path, overwrite=False).headers["location"]
                        self._send_to_datanode(location, counted)
                    else:  # https: requests' TLS settings, as for every other request
                        self.client.write(path, data=counted, overwrite=False)
                except HdfsError as exc:
                    # The datanode, not the namenode's redirect, finds the name taken.
                    someone_elses = exc.exception == "FileAlreadyExistsException"
                    raise
            if counted.error is not None:
                if isinstance(counted.error, OSError):
                    # Our side: a local file or an upload's body could not be
                    # read. HDFS answered; no outage to retry (StorageUnavailable).
                    raise source_unreadable(named, counted.error) from counted.error
                raise counted.error
        except BaseException:
            if counted.started and not someone_elses:  # HDFS made a file of what came: remove it
                try:
                    self.delete(path)
                except StorageError:
                    pass  # HDFS unreachable: a hidden partial file stays behind (listings skip it)
            raise
        return counted.size

    def _send_to_datanode(self, location: str, pieces: Iterable[bytes | memoryview]) -> None:
        """The CREATE's second step, chunk-encoded, over http.client. requests
        (urllib3) copies every chunk to frame it, a sixth of a portal worker's
        CPU on a big upload (perf); here each chunk's pieces go to the socket
        as they are, framing and all in one sendmsg."""
        url = urlsplit(location)
        conn = http.client.HTTPConnection(url.hostname or "", url.port or 80)
        try:
            try:
                conn.sock = socket.create_connection((url.hostname, url.port or 80), timeout=TIMEOUT[0])
                conn.sock.settimeout(TIMEOUT[1])
                conn.putrequest("PUT", f"{url.path}?{url.query}", skip_accept_encoding=True)
                conn.putheader("Content-Type", "application/octet-stream")
                conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders()
                for batch, size in _batches(pieces):
                    _send_all(conn.sock, [b"%x\r\n" % size, *batch, b"\r\n"])
                conn.sock.sendall(b"0\r\n\r\n")
            except OSError:
                # The datanode may have answered and closed (its own quota, say):
                # its answer says more than the broken pipe.
                self._raise_answer(conn)
                raise
            self._raise_answer(conn)
        except (OSError, http.client.HTTPException) as exc:
            raise StorageUnavailable(f"HDFS at {self.url} did not answer ({type(exc).__name__})") from None
        finally:
            conn.close()

    @staticmethod
    def _raise_answer(conn: http.client.HTTPConnection) -> None:
        """Reads the datanode's answer; raises HdfsError for an error."""
        response = conn.getresponse()
        body = response.read()
        if response.status < 400:
            return
        try:
            remote = json.loads(body)["RemoteException"]
            # The datanode's messages carry the namenode's Java stack trace.
            message = str(remote.get("message", "")).split("\n", 1)[0]
            raise HdfsError(message, exception=remote.get("exception"))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise HdfsError(f"the datanode answered {response.status}: {body[:200]!r}") from None

    def rename(self, source: str, target: str, *, overwrite: bool) -> None:
        """RENAME with renameoptions=OVERWRITE (HDFS's rename2, atomic) when
        replacing; HdfsCLI's rename() cannot pass that option. The target's
        folder is made only when the rename finds it missing: usually it is
        there, and an upload saves a request."""
        with self._errors(target):
            if not self._rename_into(source, target, overwrite=overwrite):
                self.client.makedirs(parent(target))
                if not self._rename_into(source, target, overwrite=overwrite):
                    raise StorageError(f"{target} already exists")

    def _rename_into(self, source: str, target: str, *, overwrite: bool) -> bool:
        """One RENAME; False when the target's folder is missing (or, without
        overwrite, the target exists: plain rename says only "false")."""
        if not overwrite:
            return bool(self.client._rename(source, destination=target).json()["boolean"])
        try:
            self.client._rename(source, destination=target, renameoptions="OVERWRITE")
        except HdfsError as exc:
            # rename2 names a missing target folder as FileNotFoundException
            # ("rename destination parent ... not found").
            if getattr(exc, "exception", None) == "FileNotFoundException" and "destination parent" in exc.message:
                return False
            raise
        return True

    def usage(self, path: str) -> tuple[int, int]:
        """The namenode's content summary (GETCONTENTSUMMARY): one request."""
        with self._errors(path):
            summary = self.client.content(path, strict=False)
        if summary is None:
            return 0, 0
        return int(summary["length"]), int(summary["fileCount"])

    def mkdir(self, path: str) -> None:
        with self._errors(path):
            self.client.makedirs(path)

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        if path == "/":
            raise StorageAccessDenied("the HDFS root cannot be deleted")
        with self._errors(path):
            return bool(self.client.delete(path, recursive=recursive))


class _Body:
    """Iterating yields fixed-size chunks (a binary file's own iterator
    yields "lines", which may be the whole file)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._stream.read(CHUNK):
            yield chunk


SEND_BYTES = 1024 * 1024  # per chunk sent to the datanode: fewer system calls
SEND_PIECES = 64  # and at most this many buffers per sendmsg (the kernel allows 1,024)


def _batches(pieces: Iterable[bytes | memoryview]) -> Iterator[tuple[list[bytes | memoryview], int]]:
    """The pieces grouped into chunks of about SEND_BYTES."""
    batch: list[bytes | memoryview] = []
    size = 0
    for piece in pieces:
        if not len(piece):
            continue  # an empty chunk would end the body
        batch.append(piece)
        size += len(piece)
        if size >= SEND_BYTES or len(batch) >= SEND_PIECES:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


def _send_all(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """sendmsg until every byte of `parts` is sent (it may send part of them)."""
    views = [memoryview(part) for part in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


class _Counted:
    """The pieces of a new file, counted as they are sent. If the pieces
    fail (the uploading client went away), the body ends there and the
    failure is kept for write_new to raise once HDFS has closed the file:
    a body cut off midway raced with the delete that follows (the datanode
    made the file after it)."""

    def __init__(self, pieces: Iterable[bytes | memoryview]) -> None:
        self._pieces, self.size, self.started = pieces, 0, False
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[bytes | memoryview]:
        self.started = True
        try:
            for piece in self._pieces:
                self.size += len(piece)
                yield piece
        except Exception as exc:
            self.error = exc


class _Download:
    """The datanode's answer in chunks, straight from its socket (WebHDFS
    sends no content encoding, so urllib3's decoding buffer is skipped).
    The first chunk is small: a full-size one would hold the first byte back
    until it filled. `close` (Django calls it when the response ends, sent
    or not) releases the connection."""

    FIRST = 256 * 1024

    def __init__(self, response: requests.Response, chunk_size: int) -> None:
        self._response, self._chunk_size = response, chunk_size

    def __iter__(self) -> Iterator[bytes]:
        raw = self._response.raw
        chunk = raw.read(min(self.FIRST, self._chunk_size), decode_content=False)
        while chunk:
            yield chunk
            chunk = raw.read(self._chunk_size, decode_content=False)

    def close(self) -> None:
        self._response.close()


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
    if kind == "AuthorizationException":  # the proxy-user settings do not let the portal act for this user
        return StorageAccessDenied(f"HDFS does not let the portal act for this user at {path}: {exc.message}")
    if kind in ("AccessControlException", "SecurityException") or "Authentication failure" in str(exc):
        return StorageAccessDenied(f"HDFS refuses access to {path}: {exc.message}")
    if kind in ("DSQuotaExceededException", "NSQuotaExceededException"):
        return StorageQuotaExceeded(f"HDFS's own quota refuses {path}: {exc.message}")
    if "safe mode" in (exc.message or ""):  # a namenode starting up: read-only for a while
        return StorageUnavailable(f"HDFS is starting up (safe mode) and cannot change {path} yet; try again in a minute")
    if kind == "FileAlreadyExistsException":
        return StorageError(f"{path} already exists")
    if kind == "ParentNotDirectoryException":
        return StorageError(f"{path}: a file is in the way ({exc.message})")
    if kind == "PathIsNotEmptyDirectoryException":
        return StorageError(f"{path} is not empty")
    return StorageError(f"HDFS could not handle {path}: {exc.message}")


def _check(values: Mapping[str, Any]) -> str | None:
    if not values["WEBHDFS_URL"].startswith(("http://", "https://")):
        return "STORAGE_BACKEND=webhdfs needs WEBHDFS_URL, e.g. http://namenode:9870"
    return None


register_storage(StorageKind(
    scheme="hdfs", backend="webhdfs", label=WebHdfsBackend.label, where="on HDFS", names_host=True,
    default_fs_uri="hdfs://namenode:9000", fs_uri_hint="hdfs://<namenode>:<rpc port>, e.g. hdfs://namenode:9000",
    settings=("WEBHDFS_URL", "WEBHDFS_USER"), check=_check,
    make=lambda values: WebHdfsBackend(values["WEBHDFS_URL"], user=values["WEBHDFS_USER"]),
))

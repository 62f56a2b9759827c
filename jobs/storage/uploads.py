"""Streamed uploads: the storage page's files go to storage as they arrive.

Django's own upload handlers write each file of a multipart body to a
temporary file (or memory) before the view runs, and the view then copies it
to storage: every byte crosses the disk twice and the copy starts only when
the body has been read. StorageUploadHandler instead opens a Sink in storage
(Backend.open_sink) when a file starts and hands it each chunk as the parser
reads it: on HDFS a thread sends the chunks to the datanode while the next
ones arrive. The sink writes to a temporary name in the user's own staging
folder (files.upload_staging: /.pai-upload-staging/<user>, hidden, outside
every quota); once the body is read and the view has checked the names,
access and quota, files.files_save renames each file into place (a metadata
change). A refused or broken upload removes what it wrote.

The multipart body names the target folder and the files' relative paths in
fields the parser hands to no handler, which is why files land under a
temporary name first.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest

from jobs.storage.base import PARTIAL_PREFIX, Backend, Sink
from jobs.storage.errors import StorageError
from jobs.storage.paths import join


UPLOAD_CHUNK = 256 * 1024


@dataclass
class StagedFile:
    """One uploaded file, stored under a temporary name (what request.FILES holds)."""

    name: str  # as the browser sent it (its last part only: Django strips folders)
    temp: str  # storage path of the temporary file
    size: int

    def close(self) -> None:
        """Django's uploaded files have one; nothing to close here."""


@dataclass
class Staging:
    """Where a request's files go while they arrive, and what came."""

    store: Backend
    folder: str
    files: list[StagedFile] = field(default_factory=list)
    error: StorageError | None = None

    def discard(self) -> None:
        """Remove every temporary file (a refused, failed or broken upload)."""
        for staged in self.files:
            try:
                self.store.delete(staged.temp)
            except StorageError:
                pass  # storage unreachable: a hidden temporary file stays behind
        self.files.clear()


class StorageUploadHandler(FileUploadHandler):
    """Writes each file of the body to storage as the parser reads it."""

    # The parser reads the body in pieces of the smallest handler chunk_size.
    # Smaller than CHUNK: each piece is copied several times on its way (the
    # bridge's body buffer, the parser's boundary search, the chunk framing
    # to the datanode), and 256 KB pieces took a fifth less of the worker's
    # CPU per upload than 1 MB ones (4 MB: a fifth more; 64 KB: no better),
    # measured with bench/hdfs_transfer.py's setup on a 200 MB file.
    chunk_size = UPLOAD_CHUNK

    def __init__(self, request: HttpRequest, staging: Staging) -> None:
        super().__init__(request)
        self.staging = staging
        self._sink: Sink | None = None
        self._temp = ""

    def new_file(self, *args, **kwargs) -> None:
        super().new_file(*args, **kwargs)
        self._temp = join(self.staging.folder, f"{PARTIAL_PREFIX}{secrets.token_hex(12)}")
        self._sink = self._guard(lambda: self.staging.store.open_sink(self._temp))

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self._guard(lambda: self._sink.write(raw_data))
        return None  # no other handler gets the data

    def file_complete(self, file_size: int) -> StagedFile:
        size = self._guard(self._sink.finish)
        self._sink = None
        staged = StagedFile(name=self.file_name, temp=self._temp, size=size)
        self.staging.files.append(staged)
        return staged

    def upload_interrupted(self) -> None:
        """The client went away mid-file (or a limit stopped the parser)."""
        if self._sink is not None:
            self._sink.abort()
            self._sink = None

    def _guard(self, step):
        """A storage failure stops the parser (StopUpload) and is kept for
        the view to report, rather than surfacing as a server error."""
        try:
            return step()
        except StorageError as exc:
            self.staging.error = exc
            if self._sink is not None:
                self._sink.abort()
                self._sink = None
            raise StopUpload(connection_reset=False) from None  # read the rest, so the answer reaches the browser

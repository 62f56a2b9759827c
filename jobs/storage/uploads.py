"""Streamed uploads: the storage page's files go to storage as they arrive.

Django's own upload handlers write each file of a multipart body to a
temporary file (or memory) before the view runs, and the view then copies it
to storage: every byte crosses the disk twice and the copy starts only when
the body has been read. Here the body is read with jobs/storage/multipart.py
and each file's data goes straight to Backend.write_new as it is received:
on HDFS one CREATE whose body is the upload, sent by the request's own
thread. The file is written under a temporary name in the user's own
staging folder (files.upload_staging: /.pai-upload-staging/<user>, hidden,
outside every quota); once the body is read and the view has checked the
names, access and quota, files.files_save renames each file into place (a
metadata change). A refused or broken upload removes what it wrote.

The multipart body names the target folder and the files' relative paths in
fields that may come after the files, which is why files land under a
temporary name first.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from django.conf import settings
from django.http import HttpRequest, QueryDict

from jobs.storage.base import PARTIAL_PREFIX, Backend
from jobs.storage.errors import StorageError, StorageQuotaExceeded
from jobs.storage.multipart import Field, Limits, MultipartReader, boundary_of
from jobs.storage.paths import join

# Pieces read from a body that the server does not hand over as received
# (Django's test client).
READ_SIZE = 256 * 1024
FILES_FIELD = "files"
MB = 1024 * 1024


@dataclass
class StagedFile:
    """One uploaded file, stored under a temporary name."""

    name: str  # as the client sent it (its last part only, as Django keeps it)
    temp: str  # storage path of the temporary file
    size: int


@dataclass
class Staging:
    """Where a request's files go while they arrive, and what came."""

    store: Backend
    folder: str
    # What one request may store here in all (the staging folder is outside
    # the quota, so without it a file of any size was stored whole before
    # the quota refused it); None: no limit.
    max_bytes: int | None = None
    files: list[StagedFile] = field(default_factory=list)
    error: StorageError | None = None
    received: int = 0

    def discard(self) -> None:
        """Remove every temporary file (a refused, failed or broken upload)."""
        for staged in self.files:
            try:
                self.store.delete(staged.temp)
            except StorageError:
                pass  # storage unreachable: a hidden temporary file stays behind
        self.files.clear()

    def within_limit(self, pieces: Iterable[memoryview]) -> Iterator[memoryview]:
        """The pieces, until the request's files pass max_bytes together."""
        for piece in pieces:
            self.received += len(piece)
            if self.max_bytes is not None and self.received > self.max_bytes:
                raise StorageQuotaExceeded(f"storage quota exceeded: this upload is larger than the whole quota, "
                                           f"{self.max_bytes / MB:.1f} MB (STORAGE_QUOTA_MB)")
            yield piece


def receive(request: HttpRequest, staging: Staging) -> QueryDict:
    """Reads the request's multipart body: each file of the `files` field is
    stored in `staging` as it arrives; returns the other fields. After a
    storage failure the rest of the body is read without storing (so the
    answer reaches the browser) and the failure kept in `staging.error`.
    Raises MultipartError for a body that is not what it claims."""
    reader = MultipartReader(_pieces(request), boundary_of(request.META.get("CONTENT_TYPE", "")), _limits())
    fields = QueryDict(mutable=True)
    for part in reader:
        if isinstance(part, Field):
            fields.appendlist(part.name, part.value)
        elif part.name == FILES_FIELD and staging.error is None:
            temp = join(staging.folder, f"{PARTIAL_PREFIX}{secrets.token_hex(12)}")
            try:
                size = staging.store.write_new(temp, staging.within_limit(reader.data()))
            except StorageError as exc:
                staging.error = exc
                continue
            staging.files.append(StagedFile(name=part.filename, temp=temp, size=size))
    return fields


def _pieces(request: HttpRequest) -> Iterable[bytes]:
    """The body as the server received it where it can say (portal/http_bridge),
    else read in pieces."""
    pieces = getattr(request.environ.get("wsgi.input"), "pieces", None)
    if pieces is not None:
        return pieces()
    return _read(request)


def _read(request: HttpRequest) -> Iterator[bytes]:
    while piece := request.read(READ_SIZE):
        yield piece


def _limits() -> Limits:
    return Limits(max_fields=settings.DATA_UPLOAD_MAX_NUMBER_FIELDS,
                  max_files=settings.DATA_UPLOAD_MAX_NUMBER_FILES,
                  max_field_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)

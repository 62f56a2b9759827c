"""The storage page: browse, make folders, upload, download, delete.

Paths arrive as `?path=` (a storage path, a file:// or hdfs:// URI, or a path
relative to the user's home) and are checked by jobs.storage.files for the
signed-in user. Uploads go to storage as the body arrives, with no temporary
file on the portal's disk (jobs/storage/uploads.py); downloads stream in
large chunks.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jobs import storage
from jobs.services.storage_links import folder_url
from jobs.storage import access, files, paths, uploads
from jobs.storage.access import Reader
from jobs.storage.multipart import MultipartError
from jobs.storage.uploads import Staging
from jobs.views.streaming import streaming_response

USE_AS_FIELDS = ("codeDir", "dataDir", "outputDir")


def _reader(request: HttpRequest) -> Reader:
    return storage.reader_for(user_name=request.user.username, is_admin=request.user.is_admin)


def _locate(request: HttpRequest, value: str) -> str:
    return storage.locate(value, user_name=request.user.username)


def _status(exc: storage.StorageError) -> int:
    if isinstance(exc, files.FileConflict):
        return 409
    if isinstance(exc, storage.StorageQuotaExceeded):
        return 413
    if isinstance(exc, storage.StorageAccessDenied):
        return 403
    if isinstance(exc, storage.StorageNotFound):
        return 404
    if isinstance(exc, storage.StorageUnavailable):
        return 503
    return 400


def _back(folder: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(folder_url(folder))


@require_GET
def browse(request: HttpRequest) -> HttpResponse:
    reader = _reader(request)
    context: dict = {"reader": reader, "use_as_fields": USE_AS_FIELDS}
    try:
        raw = request.GET.get("path", "").strip()
        path = _locate(request, raw) if raw else files.home_of(reader)
        folder = files.folder_open(reader, path, after=request.GET.get("after", ""),
                                   before=request.GET.get("before", ""))
    except storage.StorageError as exc:
        context.update(error=str(exc), home=reader.home)
        return render(request, "jobs/storage.html", context, status=_status(exc))
    use_as = [(field, reverse("jobs:submit") + "?" + urlencode({field: folder.uri})) for field in USE_AS_FIELDS]
    context.update(folder=folder, use_as=use_as, page_entries=files.PAGE_ENTRIES)
    return render(request, "jobs/storage.html", context)


@require_GET
def download(request: HttpRequest) -> HttpResponse:
    try:
        entry, chunks = files.file_read(_reader(request), _locate(request, request.GET.get("path", "")))
    except storage.StorageError as exc:
        return render(request, "jobs/storage.html", {"error": str(exc)}, status=_status(exc))
    # One of the user's limited open streams, counted only now that the file
    # is there and theirs to read (a 429 past the limit closes `chunks`).
    return streaming_response(request, chunks, content_type="application/octet-stream", headers={
        "Content-Length": str(entry.size), "Content-Disposition": f"attachment; filename*=UTF-8''{quote(entry.name)}"})


@require_POST
def make_folder(request: HttpRequest) -> HttpResponse:
    folder = request.POST.get("path", "")
    try:
        folder = _locate(request, folder)
        made = files.folder_create(_reader(request), folder, request.POST.get("name", "").strip())
    except storage.StorageError as exc:
        messages.error(request, f"Could not make the folder: {exc}")
        return _back(folder or "/")
    messages.success(request, f"Made folder {made}.")
    return _back(folder)


@csrf_exempt  # checked in _upload, once the body is read: the token may be one of its fields
@require_POST
def upload(request: HttpRequest) -> HttpResponse:
    """Files in `files`, stored as they arrive (jobs/storage/uploads.py);
    with a folder upload, their relative paths in `names` (same order), since
    only a file name's last part is kept."""
    wants_json = request.headers.get("Accept", "").startswith("application/json")
    try:
        staging = files.upload_staging(_reader(request))
    except storage.StorageError as exc:
        return _upload_refused(request, exc, "/", wants_json=wants_json)
    try:
        try:
            request.POST = uploads.receive(request, staging)  # the files go to storage now
        except MultipartError as exc:
            return _upload_refused(request, storage.StorageError(f"the upload could not be read: {exc}"), "/",
                                   wants_json=wants_json)
        return _upload(request, staging, wants_json=wants_json)
    finally:
        staging.discard()  # what was not moved into place (all of it, when refused)


@csrf_protect
def _upload(request: HttpRequest, staging: Staging, *, wants_json: bool) -> HttpResponse:
    uploaded = staging.files
    names = request.POST.getlist("names") or [f.name for f in uploaded]
    folder = request.POST.get("path", "")
    try:
        if staging.error is not None:
            raise staging.error
        if len(names) != len(uploaded):
            # Each file's place would be guessed: a folder upload's files
            # all put flat in one folder, under their bare names.
            raise storage.StorageError(f"names: {len(names)} relative paths for {len(uploaded)} files; a folder "
                                       "upload sends one per file, in the files' order")
        folder = _locate(request, folder)
        saved = files.files_save(_reader(request), folder, list(zip(names, uploaded)),
                                 overwrite=request.POST.get("overwrite") == "1")
    except storage.StorageError as exc:
        return _upload_refused(request, exc, folder or "/", wants_json=wants_json)
    staging.files.clear()  # moved into place: nothing left to discard
    if wants_json:
        return JsonResponse({"saved": saved})
    messages.success(request, f"Uploaded {len(saved)} file(s).")
    return _back(folder)


def _upload_refused(request: HttpRequest, exc: storage.StorageError, folder: str, *, wants_json: bool) -> HttpResponse:
    if wants_json:
        return JsonResponse({"error": str(exc)}, status=_status(exc))
    messages.error(request, f"Upload refused: {exc}")
    return _back(folder)


@require_http_methods(["GET", "POST"])
def delete(request: HttpRequest) -> HttpResponse:
    """GET asks for confirmation; POST deletes (a folder with all it holds)."""
    reader = _reader(request)
    raw = request.POST.get("path", "") if request.method == "POST" else request.GET.get("path", "")
    try:
        path = _locate(request, raw)
        if request.method == "GET":
            entry = files.path_info(reader, path)
            access.check_delete(reader, path)
            return render(request, "jobs/storage.html", {"confirm_delete": entry, "reader": reader,
                                                          "cancel_url": folder_url(paths.parent(path))})
        files.path_delete(reader, path)
    except storage.StorageError as exc:
        if request.method == "GET":
            return render(request, "jobs/storage.html", {"error": str(exc), "reader": reader}, status=_status(exc))
        messages.error(request, f"Could not delete: {exc}")
        return _back(paths.parent(raw) if raw.startswith("/") else reader.home)
    messages.success(request, f"Deleted {path}.")
    return _back(paths.parent(path))

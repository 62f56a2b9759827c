"""Links into the storage page (read-only): where a folder is shown, and a
job's codeDir, dataDir and outputDir, each linked when the viewer may
browse it. The storage view and the job page both build their links here."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.urls import reverse

from jobs import storage
from jobs.models import Job, User
from jobs.storage import access


@dataclass(frozen=True)
class StorageLink:
    field: str  # codeDir, dataDir or outputDir
    value: str
    url: str  # "" when the storage page cannot show it (another backend's URI, not the viewer's ...)


def folder_url(path: str) -> str:
    """The storage page showing the folder at `path`."""
    return reverse("jobs:storage") + "?" + urlencode({"path": path})


def job_storage_links(*, job: Job, user: User) -> list[StorageLink]:
    """The job's folders that are set, in the config's order."""
    spec = job.spec
    reader = storage.reader_for(user_name=user.username, is_admin=user.is_admin)
    links = []
    for field, value in (("codeDir", spec.code_dir), ("dataDir", spec.data_dir), ("outputDir", spec.output_dir)):
        if not value:
            continue
        try:
            path = storage.locate(value)  # stored configs hold full URIs
        except storage.StorageError:
            links.append(StorageLink(field, value, ""))
            continue
        links.append(StorageLink(field, value, folder_url(path) if access.may_read(reader, path) else ""))
    return links

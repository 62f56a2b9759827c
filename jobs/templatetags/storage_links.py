"""{% job_storage_links job as links %}: a job's codeDir, dataDir and outputDir
with a storage-page link for each one the viewer may browse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import template

from jobs import storage
from jobs.models import Job
from jobs.storage import access
from jobs.views.storage import folder_url

register = template.Library()

FIELDS = ("codeDir", "dataDir", "outputDir")


@dataclass(frozen=True)
class StorageLink:
    field: str
    value: str
    url: str  # "" when the storage page cannot show it (another backend's URI, not the viewer's ...)


@register.simple_tag(takes_context=True)
def job_storage_links(context: dict[str, Any], job: Job) -> list[StorageLink]:
    user = context.get("user") or getattr(context.get("request"), "user", None)
    if user is None or not user.is_authenticated:
        return []
    reader = storage.reader_for(user_name=user.username, is_admin=user.is_admin)
    links = []
    for field in FIELDS:
        value = str((job.config or {}).get(field) or "")
        if not value:
            continue
        try:
            path = storage.locate(value)  # stored configs hold full URIs
        except storage.StorageError:
            links.append(StorageLink(field, value, ""))
            continue
        links.append(StorageLink(field, value, folder_url(path) if access.may_read(reader, path) else ""))
    return links

"""A big folder on the storage page: read as a stream and shown a page at a
time (jobs/storage/files.py PAGE_ENTRIES), folders first and then files by
name, with Previous and Next links that reach every entry once. The whole
folder was listed, stat'ed and rendered at once: a folder of a million
files (a task's /pai/output can make any number of them) held every entry
in the web worker. On local storage and on the real HDFS (minicluster),
whose namenode answers in batches of 1,000 (LISTSTATUS_BATCH)."""

from __future__ import annotations

import io
import re
from html import unescape

import pytest
from django.test import Client, override_settings

from jobs import storage
from jobs.storage import files

FOLDERS, FILES = 1030, 40  # past the namenode's batch of 1,000, and past a page


def fill(home: str) -> list[str]:
    """The folder `home`/big; its entries' names in the page's order."""
    backend = storage.backend()
    folder = f"{home}/big"
    backend.mkdir(folder)
    folders = [f"D{i:04d}" for i in range(FOLDERS)]
    for name in folders:
        backend.mkdir(f"{folder}/{name}")
    names = [f"f{i:03d}.txt" for i in range(FILES)] + ["Zeta.txt", "alpha.TXT"]
    for name in names:
        backend.write(f"{folder}/{name}", io.BytesIO(name.encode()))
    return [f"{n}/" for n in sorted(folders, key=str.lower)] + sorted(names, key=lambda n: (n.lower(), n))


def shown(page) -> list[str]:
    return [unescape(name) for name in re.findall(r'<a class="(?:folder|file)"[^>]*>([^<]+)</a>', page)]


def link(page: str, rel: str) -> str | None:
    found = re.search(rf'<a rel="{rel}" href="([^"]+)"', page)
    return unescape(found.group(1)) if found else None


def read_all_pages(client: Client, folder: str, expected: list[str]) -> None:
    page = client.get("/storage/", {"path": folder}).content.decode()
    seen, pages = shown(page), [page]
    assert f"Entries 1–{files.PAGE_ENTRIES} of {len(expected)}" in page
    while (after := link(page, "next")) is not None:
        page = client.get(after).content.decode()
        seen += shown(page)
        pages.append(page)
    assert seen == expected  # each once, folders first, by name whatever its case
    assert link(pages[0], "prev") is None
    back = link(pages[-1], "prev")
    assert back is not None
    assert shown(client.get(back).content.decode()) == expected[-len(shown(pages[-1])) - files.PAGE_ENTRIES:
                                                                  -len(shown(pages[-1]))]


def test_a_big_local_folder_is_shown_a_page_at_a_time(alice, bob, monkeypatch) -> None:
    monkeypatch.setattr(files, "PAGE_ENTRIES", 400)
    home = f"/{alice.username}"
    expected = fill(home)
    try:
        client = Client()
        client.force_login(alice)
        read_all_pages(client, f"{home}/big", expected)
        odd = client.get("/storage/", {"path": f"{home}/big", "after": "x:nothing"})
        assert odd.status_code == 400 and "after: expected d:&lt;folder name&gt; or f:&lt;file name&gt;" in \
            odd.content.decode()
        other = Client()
        other.force_login(bob)
        assert other.get("/storage/", {"path": f"{home}/big", "after": "d:D0001"}).status_code == 403
        assert Client().get("/storage/", {"path": f"{home}/big"}).status_code == 302  # to the login page
    finally:
        storage.backend().delete(f"{home}/big", recursive=True)


@pytest.mark.services
def test_a_big_hdfs_folder_is_read_in_the_namenodes_batches_and_shown_a_page_at_a_time(hdfs_cluster, alice) -> None:
    with override_settings(**hdfs_cluster.portal_settings()):
        home = f"/{alice.username}"
        storage.ensure_home(storage.reader_for(user_name=alice.username, is_admin=False), home)
        expected = fill(home)
        try:
            client = Client()
            client.force_login(alice)
            read_all_pages(client, f"{home}/big", expected)
        finally:
            storage.backend().delete(f"{home}/big", recursive=True)

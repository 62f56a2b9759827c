"""Storage review findings: each test failed before its fix."""

from __future__ import annotations

import io

from jobs import storage
from jobs.storage import files, uploads
from jobs.storage.local import LocalBackend

MB = 1024 * 1024


def test_a_download_sends_the_file_it_opened_even_when_it_is_replaced_before_it_is_read(alice) -> None:
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/model.bin", io.BytesIO(b"old" * 10))
    reader = storage.reader_for(user_name=alice.username, is_admin=False)
    entry, chunks = files.file_read(reader, f"{home}/model.bin")
    # A new version is uploaded (moved into place whole) before the client reads a byte.
    storage.backend().write(f"{home}/model.bin", io.BytesIO(b"NEW" * 20), overwrite=True)
    body = b"".join(chunks)
    assert entry.size == len(body)
    assert body == b"old" * 10


def test_an_upload_stops_being_stored_once_it_holds_more_than_the_quota(alice, alice_client, settings,
                                                                         monkeypatch) -> None:
    """The staging folder is outside the quota while a request's files
    arrive: a file of any size was stored whole (filling the disk for
    everyone) before the quota refused it."""
    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES = 1, 0
    stored: list[int] = []
    write_new = LocalBackend.write_new

    def counting(self, path: str, pieces):
        def counted():
            for piece in pieces:
                stored.append(len(piece))
                yield piece
        return write_new(self, path, counted())

    monkeypatch.setattr(LocalBackend, "write_new", counting)
    big = io.BytesIO(b"x" * 8 * MB)
    big.name = "big.bin"
    refused = alice_client.post("/storage/upload/", {"path": f"/{alice.username}", "files": [big]},
                                headers={"accept": "application/json"})
    assert refused.status_code == 413
    assert "storage quota" in refused.json()["error"]
    assert sum(stored) <= MB + uploads.READ_SIZE
    staged = storage.backend().root / files.UPLOAD_STAGING.lstrip("/") / alice.username
    assert staged.is_dir() and not list(staged.iterdir())  # what was stored is removed
    assert storage.backend().stat(f"/{alice.username}/big.bin") is None

"""Storage review findings: each test failed before its fix."""

from __future__ import annotations

import io

from jobs import storage
from jobs.storage import files


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

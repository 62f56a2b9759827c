"""The reference workflow end to end in Debian's Chromium: upload a code
folder on the storage page, use it as codeDir, run a job on the test cluster
that runs the uploaded script and saves a file to /pai/output, and find that
file in outputDir on the storage page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from jobs import services, storage
from jobs.models import State
from tests.browser import login, screenshot
from tests.helpers import config, lines, role, wait_state

pytestmark = [pytest.mark.services, pytest.mark.browser]

RUN_SH = """echo "running $(basename "$PWD")/run.sh from codeDir"
cat lib/greeting.txt
echo "code is read-only: $(touch /pai/code/x 2>/dev/null && echo no || echo yes)"
echo "trained on $PAI_DATA_DIR" > /pai/output/model.txt
"""


def test_it_runs_a_job_on_code_uploaded_through_the_storage_page(page, alice, cluster, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "lib").mkdir(parents=True)
    (project / "run.sh").write_text(RUN_SH)
    (project / "lib" / "greeting.txt").write_text("hello from an uploaded file\n")
    home = f"/{alice.username}"

    login(page, alice)
    page.goto("/storage/")
    expect(page.locator("#folder-uri")).to_have_text(f"file://{home}")
    page.locator("#upload-folder").set_input_files(project)
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("link", name="proj/")).to_be_visible()  # the page reloads when done
    assert storage.backend().stat(f"{home}/proj/lib/greeting.txt").size == len("hello from an uploaded file\n")

    page.get_by_role("link", name="proj/").click()
    expect(page.get_by_role("link", name="lib/")).to_be_visible()
    expect(page.locator("tr", has_text="run.sh")).to_contain_text(f"{len(RUN_SH)} bytes")
    screenshot(page, "storage-folder")

    # "Use as codeDir" opens Submit Job with the folder filled in.
    page.locator('[data-use-as="codeDir"]').click()
    page.wait_for_url(re.compile(r"/submit/\?codeDir="))
    expect(page.locator('[data-path="codeDir"]')).to_have_value(f"file://{home}/proj")

    # The job goes in through the service, asking for /pai/output to be
    # uploaded (the Submit page has no switch for that per-job setting).
    cfg = config("fromstorage", role(command="sh run.sh"), codeDir=f"file://{home}/proj", dataDir="/shared/data")
    job = wait_state(services.job_submit(owner=alice, config=json.dumps(cfg), upload_outputs=True),
                     State.SUCCEEDED, timeout=90)
    assert lines(job) == ["running work/run.sh from codeDir", "hello from an uploaded file", "code is read-only: yes"]

    # The job page links its folders to the storage page.
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator('[data-storage-link="codeDir"]')).to_have_attribute("href", f"/storage/?path={quote(home, safe='')}%2Fproj")
    screenshot(page, "job-folders")
    page.locator('[data-storage-link="outputDir"]').click()
    expect(page.locator("#folder-uri")).to_have_text(f"file:///Output/{alice.username}/fromstorage")
    expect(page.get_by_role("link", name="model.txt").first).to_be_visible()
    with page.expect_download() as download:
        page.get_by_role("link", name="model.txt").first.click()
    assert Path(download.value.path()).read_text() == "trained on file:///shared/data\n"  # PAI_DATA_DIR, a full URI
    screenshot(page, "storage-output")

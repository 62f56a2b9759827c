"""A real HDFS for the tests: hadoop/minicluster (Hadoop's MiniDFSCluster, a
NameNode and a DataNode in one JVM, WebHDFS and permissions on) on
127.0.0.1 ports picked here.

One per pytest session, started the first time a test asks for the
`hdfs_cluster` fixture (conftest.py) and stopped by PID when the session
ends; it also stops by itself if this process dies first (--parent-pid).
Building it needs Maven once (scripts/test does it: `mvn compile` resolves
Hadoop into Maven's local cache and writes target/classpath.txt); running
it needs only java. It starts in about 6 s.

The portal's service user is "pai" (WEBHDFS_USER): an HDFS superuser (group
"supergroup") allowed to act for every user from 127.0.0.1, as the README
asks of a production cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.cluster import ROOT, free_port, wait_for
from tests.settings import TEST_VAR

MINICLUSTER = ROOT / "hadoop" / "minicluster"
CLASSPATH = MINICLUSTER / "target" / "classpath.txt"
SERVICE_USER = "pai"
READY = "MINIHDFS READY"


def build() -> None:
    """Compile the launcher (and resolve Hadoop into ~/.m2) when its sources
    are newer than the last build. Raises FileNotFoundError without mvn/java."""
    for program in ("java", "mvn"):
        if shutil.which(program) is None:
            raise FileNotFoundError(program)
    sources = [MINICLUSTER / "pom.xml", *(p for p in (MINICLUSTER / "src").rglob("*") if p.is_file())]
    newest = max(p.stat().st_mtime for p in sources)
    if CLASSPATH.exists() and CLASSPATH.stat().st_mtime >= newest:
        return
    subprocess.run(["mvn", "-B", "-q", "-f", str(MINICLUSTER / "pom.xml"), "compile"], check=True, timeout=900)
    CLASSPATH.touch()  # Maven leaves an unchanged file's time alone


@dataclass
class MiniHdfs:
    """One minicluster process. `start()` waits until WebHDFS answers."""

    base_dir: Path
    rpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    log_path: Path = TEST_VAR / "logs" / "minihdfs.log"
    popen: subprocess.Popen | None = None
    _log_start: int = 0  # where this start's lines begin in the log

    @property
    def url(self) -> str:
        """WEBHDFS_URL."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def fs_uri(self) -> str:
        """PAI_DEFAULT_FS_URI."""
        return f"hdfs://127.0.0.1:{self.rpc_port}"

    def portal_settings(self) -> dict[str, str]:
        """The environment that points a portal process (gunicorn, a node agent) here."""
        return {"STORAGE_BACKEND": "webhdfs", "WEBHDFS_URL": self.url, "WEBHDFS_USER": SERVICE_USER,
                "PAI_DEFAULT_FS_URI": self.fs_uri}

    def start(self, *, timeout: float = 120) -> MiniHdfs:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        classpath = f"{MINICLUSTER / 'target' / 'classes'}:{CLASSPATH.read_text().strip()}"
        args = ["java", "-Xmx768m", "-cp", classpath, "portal.minicluster.MiniHdfs",
                "--rpc-port", str(self.rpc_port), "--http-port", str(self.http_port),
                "--base-dir", str(self.base_dir), "--proxy-user", SERVICE_USER, "--parent-pid", str(os.getpid())]
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._answers, timeout=timeout, interval=0.2, what=f"the HDFS minicluster (log: {self.log_path})")
        return self

    def _answers(self) -> bool:
        if self.popen is None or self.popen.poll() is not None:
            raise AssertionError(f"the HDFS minicluster exited:\n{self.log_tail()}")
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            if READY.encode() not in log.read():  # printed once the namenode is out of safe mode
                return False
        return self.webhdfs("GET", "/", op="GETFILESTATUS").status_code == 200

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to our JVM only (its shutdown hook stops both servers)."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)

    def restart(self) -> None:
        """Stop and start again on the same ports, keeping the file system."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------- WebHDFS, called directly

    def webhdfs(self, method: str, path: str, *, user: str = SERVICE_USER, data: bytes | None = None,
                **params: str) -> requests.Response:
        """One WebHDFS call as `user` (user.name; no doas), following the
        namenode's redirect to the datanode, as any HDFS client could."""
        url = f"{self.url}/webhdfs/v1{path}"
        response = requests.request(method, url, params={"user.name": user, **params}, allow_redirects=False,
                                    timeout=30)
        if response.status_code == 307:
            response = requests.request(method, response.headers["Location"], data=data, timeout=30)
        return response

    def status(self, path: str) -> dict | None:
        response = self.webhdfs("GET", path, op="GETFILESTATUS")
        return None if response.status_code == 404 else response.json()["FileStatus"]

    def read(self, path: str, *, user: str = SERVICE_USER) -> bytes:
        response = self.webhdfs("GET", path, user=user, op="OPEN")
        response.raise_for_status()
        return response.content


def start_session_cluster() -> MiniHdfs:
    """Build if needed and start this session's minicluster (fresh file system)."""
    build()
    base_dir = TEST_VAR / "hdfs"
    shutil.rmtree(base_dir, ignore_errors=True)
    started = time.monotonic()
    cluster = MiniHdfs(base_dir=base_dir).start()
    cluster.started_in = time.monotonic() - started  # type: ignore[attr-defined]
    return cluster

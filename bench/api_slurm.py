"""A throwaway one-node Slurm for bench/api_submit_rate.py: Debian's munged,
slurmctld and slurmd, with their own key, socket, config, state and logs in
a temp folder, on 127.0.0.1 and ports of their own. Started as daemons and
stopped by the PIDs in their pidfiles; nothing else on the machine is
touched (the system's /etc/munge and /etc/slurm are not used).

Needs `apt-get install slurm-wlm munge` and root (slurmd runs jobs as the
submitting user).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.stack import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _node_hardware() -> str:
    """This machine's CPUs and memory as slurmd sees them (`slurmd -C`)."""
    out = subprocess.run([_path("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
    memory = max(256, int(fields.get("RealMemory", "1024")) - 512)
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    return " ".join(f"{k}={fields[k]}" for k in keep if k in fields) + f" RealMemory={memory}"


def _path(program: str) -> str:
    return shutil.which(program) or str(Path("/usr/sbin", program))


class Slurm:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge.socket"
        self.pidfiles = {name: self.dir / f"{name}.pid" for name in ("munged", "slurmctld", "slurmd")}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.jobs_dir = self.dir / "jobs"

    # ---------------------------------------------------------------- start

    def start(self) -> None:
        for sub in ("state", "spool", "log", "jobs"):
            (self.dir / sub).mkdir()
        self._start_munge()
        self._write_conf()
        self._daemon("slurmctld", [_path("slurmctld"), "-f", str(self.conf), "-i"])
        self._daemon("slurmd", [_path("slurmd"), "-f", str(self.conf), "-N", "benchnode"])
        self._wait(lambda: "idle" in self._run(["sinfo", "-h", "-o", "%T"]).stdout, 60, "the Slurm node to be idle")

    def _start_munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self._daemon("munged", [
            _path("munged"), "--force", f"--socket={self.socket}", f"--key-file={key}",
            f"--pid-file={self.pidfiles['munged']}", f"--log-file={self.dir / 'log' / 'munged.log'}",
            f"--seed-file={self.dir / 'munged.seed'}",
        ])

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        log = self.dir / "log"
        self.conf.write_text(f"""\
ClusterName=bench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={self.dir / 'state'}
SlurmdSpoolDir={self.dir / 'spool'}
SlurmctldPidFile={self.pidfiles['slurmctld']}
SlurmdPidFile={self.pidfiles['slurmd']}
SlurmctldLogFile={log / 'slurmctld.log'}
SlurmdLogFile={log / 'slurmd.log'}
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MaxJobCount=100000
NodeName=benchnode NodeAddr=127.0.0.1 {_node_hardware()} State=UNKNOWN
PartitionName=bench Nodes=benchnode Default=YES MaxTime=INFINITE State=UP
""")

    def _daemon(self, name: str, command: list[str]) -> None:
        log = self.dir / "log" / f"{name}.out"
        with open(log, "ab") as out:
            result = subprocess.run(command, env=self.env, stdout=out, stderr=subprocess.STDOUT, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{name} did not start; see {self.dir / 'log'}")
        self._wait(lambda: self._pid(name) is not None, 30, f"{name}'s pidfile")

    def _pid(self, name: str) -> int | None:
        try:
            pid = int(self.pidfiles[name].read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def _run(self, command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([_path(command[0]), *command[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60)

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}")

    # ------------------------------------------------------------------- use

    def sbatch(self) -> bool:
        """`sbatch --wrap true`, as a user would type it."""
        result = subprocess.run([_path("sbatch"), "--wrap", "true"], env=self.env, cwd=self.jobs_dir,
                                capture_output=True, text=True, timeout=120)
        return result.returncode == 0 and result.stdout.startswith("Submitted batch job")

    def queued(self) -> int:
        return len(self._run(["squeue", "-h", "-o", "%i"]).stdout.split())

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Cancel what is still queued, let running jobs end, stop the three
        daemons by their pidfiles, remove the folder."""
        if self._pid("slurmctld") is not None:
            self._run(["scancel", "--state=PENDING", "--full"])
            try:
                self._wait(lambda: self.queued() == 0, 120, "Slurm's queue to drain")
            except RuntimeError:
                self._run(["scancel", "--full", "--signal=KILL"])
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self._pid(name)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            try:
                self._wait(lambda: self._pid(name) is None, 30, f"{name} to stop")
            except RuntimeError:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

"""Run the node agent for this machine (or a second, simulated node on it).

    manage.py node_agent --name gpu-01 --address 10.0.0.5
    manage.py node_agent --name sim-a --ports 21000-21099 --gpus 4 --gpu-type V100

CPUs and memory come from the OS unless given; GPUs from nvidia-smi unless
--gpus declares simulated ones (allocated and exposed through the usual
variables, but no device is requested from Docker).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.node import launcher
from jobs.node.agent import AgentConflict, NodeAgent
from jobs.models import node_name_validator
from jobs.services import NodeInfo
from jobs.services.nodes import engine_conflicts_of, node_address_clash, node_address_warning
from jobs.spec import GPU_TYPE_RE, MAX_GPU_TYPE_LENGTH


def detect_gpus() -> list[dict]:
    """Real GPUs from nvidia-smi: [{"index": 0, "type": "V100"}, ...]."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    gpus = []
    for line in output.splitlines():
        index, _, name = line.partition(",")
        if index.strip().isdigit():
            gpus.append({"index": int(index), "type": gpu_type_from_name(name.strip())})
    return gpus


def gpu_type_from_name(name: str) -> str:
    """"Tesla V100-SXM2-16GB" -> "V100", "NVIDIA A100-SXM4-40GB" -> "A100"."""
    words = [w for w in re.split(r"\s+", name) if w and w.upper() not in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")]
    return re.sub(r"[^A-Za-z0-9]", "", "".join(words).split("-")[0]) or "GPU"


def memory_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def port_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not match:
        raise CommandError(f"--ports {text!r}: expected FIRST-LAST, e.g. 20000-20999")
    start, end = int(match.group(1)), int(match.group(2))
    if not 1024 <= start <= end <= 65535:
        raise CommandError(f"--ports {text!r}: expected 1024 <= FIRST <= LAST <= 65535")
    return start, end


def ephemeral_overlap(start: int, end: int) -> tuple[int, int] | None:
    """The kernel's range for outgoing connections' local ports, if ours
    overlaps it: a port there may be taken by any client at any moment, and
    a task given it would fail to start ("address already in use")."""
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    except (OSError, ValueError):
        return None
    return (low, high) if start <= high and low <= end else None


class Command(BaseCommand):
    help = "Run this machine's node agent: register, heartbeat, launch and watch task containers."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", default=socket.gethostname(), help="node name (default: the host name)")
        parser.add_argument("--address", default="127.0.0.2",
                            help="address users and other tasks reach this node at; never one of the portal's own "
                                 "host names (default 127.0.0.2: loopback, apart from the portal's 127.0.0.1)")
        parser.add_argument("--docker-host", default=settings.DOCKER_HOST)
        parser.add_argument("--ports", default="20000-20999", help="host port range for tasks (FIRST-LAST)")
        parser.add_argument("--cpus", type=int, help="CPUs to offer (default: all the OS reports)")
        parser.add_argument("--memory-mb", type=int, help="memory to offer in MB (default: all the OS reports)")
        parser.add_argument("--gpus", type=int, default=0, help="declare this many simulated GPUs")
        parser.add_argument("--gpu-type", default="SIM", help="type of the simulated GPUs (e.g. V100)")

    def handle(self, *args, **options) -> None:
        try:
            node_name_validator(options["name"])
        except Exception:
            raise CommandError(f"--name {options['name']!r}: letters, digits, - _ and . only") from None
        gpu_type = options["gpu_type"]
        # A type no job's gpuType can name would be GPUs nobody can ask for.
        if not GPU_TYPE_RE.match(gpu_type) or len(gpu_type) > MAX_GPU_TYPE_LENGTH:
            raise CommandError(f"--gpu-type {gpu_type!r}: expected a GPU type as a job's gpuType names it: "
                               f"1 to {MAX_GPU_TYPE_LENGTH} letters, digits and - . _ (e.g. V100)")
        for address, what in ((options["address"], "--address"), (settings.NODE_WEB_PORT_ADDRESS, "NODE_WEB_PORT_ADDRESS")):
            clash = node_address_clash(address)
            if clash:
                raise CommandError(f"{what} {clash}")
        warning = node_address_warning()
        if warning:
            self.stderr.write(f"WARNING: {warning}")
        start, end = port_range(options["ports"])
        overlap = ephemeral_overlap(start, end)
        if overlap:
            self.stderr.write(f"warning: --ports {start}-{end} overlaps the kernel's ephemeral ports "
                              f"{overlap[0]}-{overlap[1]} (net.ipv4.ip_local_port_range); tasks may fail to "
                              f"bind their ports. Choose a range outside it.")
        try:
            engine = launcher.engine_for(options["docker_host"])
            engine_info = engine.info()
            marker = engine.engine_marker()
        except Exception as exc:
            raise CommandError(f"no Docker engine at {options['docker_host']}: {exc}") from None
        if options["gpus"]:
            gpus = [{"index": i, "type": options["gpu_type"]} for i in range(options["gpus"])]
        else:
            gpus = detect_gpus()
        info = NodeInfo(
            name=options["name"], address=options["address"], docker_host=options["docker_host"],
            engine_id=engine_info.id, cpus=options["cpus"] or os.cpu_count() or 1,
            memory_mb=options["memory_mb"] or memory_mb(), gpus=gpus, gpus_simulated=bool(options["gpus"]),
            port_start=start, port_end=end, agent_pid=os.getpid(), agent_host=socket.gethostname(),
            engine_marker=marker,
        )
        agent = NodeAgent(info, engine, engine_cpus=engine_info.cpus)
        try:
            agent.start()
        except AgentConflict as exc:
            raise CommandError(str(exc)) from None
        kind = "simulated " if info.gpus_simulated else ""
        self.stdout.write(f"node {info.name} ready: {info.cpus} CPUs, {info.memory_mb} MB, "
                          f"{len(gpus)} {kind}GPUs, ports {start}-{end}, engine {engine_info.name} "
                          f"(marker {marker[:8]})")
        for warning in engine_conflicts_of(info.name):
            self.stderr.write(f"WARNING: {warning}")
        self.stdout.flush()
        try:
            agent.work()
        finally:
            agent.shutdown()

"""Usage sampling on a node: every USAGE_SAMPLE_SECONDS the node agent reads
each running task's container counters (one cheap read each, through the
engine: cgroup files on this machine, jobs/node/launcher/cgroups.py) and
the utilisation of the real GPUs it holds (NVML, through nvidia-ml-py),
and stores the round in one INSERT (jobs/services/usage.py).

CPU percent is the CPU time a container used between two rounds over the
time between them (100 = one core busy), so a task's first round only
primes its counters and its first sample comes a period later. Simulated
GPUs have no utilisation to read: their tasks' samples carry no GPU figures
(never invented ones), and they are never flagged idle.

Once a minute the sampler also rolls the marked minutes up per job attempt
(the job-wide summary's, jobs/services/usage_rollup.py) and folds old
samples (one agent of the cluster at a time, by a Redis lock: two at once
would be correct, only wasted), and checks its node's tasks for idle GPUs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.conf import settings
from django.db import close_old_connections, connection

from jobs import queues
from jobs.node.context import NodeContext
from jobs.node.launcher import ContainerUsage
from jobs.services import db_clock, usage, usage_rollup

log = logging.getLogger(__name__)

HOUSEKEEPING_SECONDS = 60.0


class GpuReader(Protocol):
    def read(self, indexes: list[int]) -> list[dict[str, Any]]:
        """[{"index", "utilPercent", "memoryUsedBytes"}] of the GPUs that
        could be read; [] if none."""


class NvmlGpus:
    """Real NVIDIA GPUs through NVML (nvidia-ml-py's `pynvml`)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    @classmethod
    def open(cls) -> NvmlGpus | None:
        """NVML if this machine has it (a driver with libnvidia-ml), else None."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no device: no GPU figures
            log.warning("no GPU utilisation on this node: NVML is not available (%s)", exc)
            return None
        return cls(pynvml)

    def read(self, indexes: list[int]) -> list[dict[str, Any]]:
        found = []
        for index in indexes:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle).used
            except self._nvml.NVMLError:
                continue
            found.append({"index": index, "utilPercent": float(util), "memoryUsedBytes": int(memory)})
        return found


def cpu_percent(before: tuple[int, ContainerUsage], after: tuple[int, ContainerUsage]) -> float:
    """CPU use between two (monotonic ns, counters) readings; 100 = one core."""
    elapsed = after[0] - before[0]
    used = after[1].cpu_ns - before[1].cpu_ns
    if elapsed <= 0 or used < 0:
        return 0.0  # a counter reset (a container restarted in place): no figure this round
    return 100.0 * used / elapsed


class UsageSampler:
    """Runs in a thread of the node agent (see `run`); `sample_round` is one round."""

    def __init__(self, ctx: NodeContext, *, gpus: GpuReader | None | Callable[[], GpuReader | None] = NvmlGpus.open,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.ctx = ctx
        self._gpu_source = gpus
        self._gpus: GpuReader | None = None
        self._gpus_opened = False
        self._clock = clock
        self._last: dict[int, tuple[int, ContainerUsage]] = {}  # attempt id: (ns, counters)
        self._housekeeping_at = 0.0

    def _gpu_reader(self) -> GpuReader | None:
        node = self.ctx.node
        if node.gpus_simulated or not node.gpus:
            return None
        if not self._gpus_opened:  # NVML is opened once, only on nodes with real GPUs
            self._gpus_opened = True
            source = self._gpu_source
            self._gpus = source() if callable(source) else source
        return self._gpus

    def sample_round(self) -> int:
        """Read every running task of the node and store what changed since
        the last round; returns the samples written (in one INSERT)."""
        tasks = usage.running_on_node(self.ctx.node.pk)
        readings = self.ctx.engine.usage([task.container_id for task in tasks])
        now_ns, at = self._clock(), db_clock.now()
        gpus = self._gpu_reader()
        samples = []
        for task in tasks:
            reading = readings.get(task.container_id)
            if reading is None:
                continue
            before = self._last.get(task.attempt_id)
            self._last[task.attempt_id] = (now_ns, reading)
            if before is None or reading.cpu_ns < before[1].cpu_ns:
                continue  # its first round, or a counter that went back: no CPU figure until the next one
            samples.append(usage.Sample(
                attempt_id=task.attempt_id, at=at, cpu_percent=cpu_percent(before, (now_ns, reading)),
                memory_bytes=reading.memory_bytes, network_rx_bytes=reading.network_rx_bytes,
                network_tx_bytes=reading.network_tx_bytes, block_read_bytes=reading.block_read_bytes,
                block_write_bytes=reading.block_write_bytes,
                gpus=gpus.read(task.gpus) if gpus is not None and task.gpus else [],
            ))
        running = {task.attempt_id for task in tasks}
        for gone in set(self._last) - running:
            del self._last[gone]
        return usage.samples_record(samples)

    def housekeeping(self) -> None:
        """Roll marked minutes up and fold old samples (one agent at a
        time), and flag idle GPUs here."""
        lock = f"{settings.PAI_INSTANCE}:usage-compact"
        if queues.connection().set(lock, self.ctx.node.name, nx=True, ex=int(HOUSEKEEPING_SECONDS)):
            usage_rollup.usage_rollup()
            usage.usage_compact()
        usage.idle_gpus_check(node_id=self.ctx.node.pk)

    def run(self, stopping: threading.Event) -> None:
        """Sample until `stopping` is set; a failed round is logged and the
        next one tries again."""
        while not stopping.wait(settings.USAGE_SAMPLE_SECONDS):
            try:
                close_old_connections()
                self.sample_round()
                if time.monotonic() - self._housekeeping_at >= HOUSEKEEPING_SECONDS:
                    self._housekeeping_at = time.monotonic()
                    self.housekeeping()
            except Exception:
                log.exception("usage sampling failed")
                connection.close()
        self.ctx.engine.close_thread_client()

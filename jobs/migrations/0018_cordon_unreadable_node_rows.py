"""Node rows written before the admin checked them (an edited `gpus` of the
wrong shape, an empty or out-of-range port range) broke the node pages,
Submit Job and the scheduler for every user. Such a row is made readable
and cordoned, so no task is placed on it until an admin looks:

- `gpus` that an agent would never register become [] (the node's agent
  writes the real list again when it next registers);
- a port range no task could use is kept as it is, for the admin to see.

Both are named in `cordoned_by`, which the Nodes page and the admin show.
A node an admin had cordoned already keeps that admin's name and the time
of the cordon; the problems are added after the name. Going back changes
nothing: the rows stay readable.

The checks are written out here as they were when this migration was made
(jobs.models' validators at the time), so that a later change to those
cannot change what this migration does to a database upgraded after it.
"""

import re

from django.db import migrations
from django.utils import timezone

CORDONED_BY_MAX = 150  # Node.cordoned_by's max_length
NODE_PORTS = (1024, 65535)
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9\-._]+\Z")
MAX_GPU_TYPE_LENGTH = 64
GPUS_RESET = "gpus unreadable, set to []"


def gpus_readable(gpus: object) -> bool:
    """A list of {"index": n, "type": "V100"}, each index once."""
    if not isinstance(gpus, list):
        return False
    seen: set[int] = set()
    for gpu in gpus:
        if not isinstance(gpu, dict) or set(gpu) != {"index", "type"}:
            return False
        index, kind = gpu["index"], gpu["type"]
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or index in seen:
            return False
        if not isinstance(kind, str) or not GPU_TYPE_RE.match(kind) or len(kind) > MAX_GPU_TYPE_LENGTH:
            return False
        seen.add(index)
    return True


def port_range_usable(port_start: int | None, port_end: int | None) -> bool:
    low, high = NODE_PORTS
    if any(port is not None and not low <= port <= high for port in (port_start, port_end)):
        return False
    return port_start is None or port_end is None or port_end >= port_start


def problems(gpus: object, port_start: int | None, port_end: int | None) -> list[str]:
    """Why a row cannot be used as it is (nothing when it can)."""
    found = []
    if not gpus_readable(gpus):
        found.append(GPUS_RESET)
    if not port_range_usable(port_start, port_end):
        found.append(f"port range {port_start}-{port_end} unusable")
    return found


def cordon_note(cordoned_by: str, found: list[str]) -> str:
    """`cordoned_by` naming the problems, after the admin who had cordoned
    the node if one had (each problem once, however often this runs)."""
    missing = [problem for problem in found if problem not in cordoned_by]
    if not missing:
        return cordoned_by
    note = "migration 0018: " + "; ".join(missing)
    return (f"{cordoned_by} ({note})" if cordoned_by else note)[:CORDONED_BY_MAX]


def cordon_unreadable(node_model, using: str = "default") -> int:
    """Repair and cordon every node row with a problem; how many there were."""
    repaired = 0
    for node in node_model.objects.using(using).all():
        found = problems(node.gpus, node.port_start, node.port_end)
        if not found:
            continue
        if GPUS_RESET in found:
            node.gpus = []
        # An admin's cordon stays theirs: who and since when.
        if node.schedulable or node.cordoned_at is None:
            node.cordoned_at = timezone.now()
        node.schedulable = False
        node.cordoned_by = cordon_note(node.cordoned_by, found)
        node.save(using=using, update_fields=["gpus", "schedulable", "cordoned_at", "cordoned_by"])
        repaired += 1
    return repaired


def forwards(apps, schema_editor) -> None:
    cordon_unreadable(apps.get_model("jobs", "Node"), using=schema_editor.connection.alias)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0017_job_task_attempt_fk_without_own_index")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

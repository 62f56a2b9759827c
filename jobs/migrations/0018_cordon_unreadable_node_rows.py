"""Node rows written before the admin checked them (an edited `gpus` of the
wrong shape, an empty or out-of-range port range) broke the node pages,
Submit Job and the scheduler for every user. Such a row is made readable
and cordoned, so no task is placed on it until an admin looks:

- `gpus` that an agent would never register become [] (the node's agent
  writes the real list again when it next registers);
- a port range no task could use is kept as it is, for the admin to see.

Both are named in `cordoned_by`, which the Nodes page and the admin show.
Going back changes nothing: the rows stay readable.
"""

from django.core.exceptions import ValidationError
from django.db import migrations
from django.utils import timezone

from jobs.models import node_port_range_errors, validate_node_gpus

CORDONED_BY_MAX = 150  # Node.cordoned_by's max_length


def problems(gpus: object, port_start: int | None, port_end: int | None) -> list[str]:
    """Why a row cannot be used as it is (nothing when it can)."""
    found = []
    try:
        validate_node_gpus(gpus)
    except ValidationError:
        found.append("gpus unreadable, set to []")
    if node_port_range_errors(port_start, port_end):
        found.append(f"port range {port_start}-{port_end} unusable")
    return found


def cordon_unreadable(node_model) -> int:
    """Repair and cordon every node row with a problem; how many there were."""
    repaired = 0
    for node in node_model.objects.all():
        found = problems(node.gpus, node.port_start, node.port_end)
        if not found:
            continue
        if "gpus unreadable, set to []" in found:
            node.gpus = []
        node.schedulable = False
        node.cordoned_at = timezone.now()
        node.cordoned_by = ("migration 0018: " + "; ".join(found))[:CORDONED_BY_MAX]
        node.save(update_fields=["gpus", "schedulable", "cordoned_at", "cordoned_by"])
        repaired += 1
    return repaired


def forwards(apps, schema_editor) -> None:
    cordon_unreadable(apps.get_model("jobs", "Node"))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0017_job_task_attempt_fk_without_own_index")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

"""RQ entry points: ids in, a service or the node agent out. Nothing else.

queues.py enqueues these by dotted path ("jobs.tasks.launch_task" ...):
keep their names and module."""

from django.conf import settings

from jobs import queues, services
from jobs.node import agent
from jobs.services import notifications


def schedule() -> int:
    queues.wait_for_pass_slot(settings.SCHEDULER_MIN_PASS_GAP, settings.SCHEDULER_MAX_PASS_GAP)
    return services.schedule_pass(here=agent.launch_here())


def launch_task(attempt_id: int, owner_id: int | None = None) -> None:
    # owner_id: None in a request queued by a portal from before it was sent.
    queues.launch_started(attempt_id)
    agent.current().runner.launch(attempt_id, owner_id)


def stop_task(attempt_id: int) -> None:
    agent.current().runner.stop(attempt_id)


def notify_job_state(event: dict) -> None:
    # Stored before the hand-over: a delivery still waiting on the agent's
    # threads when it stops is then in the database for the repair sweep.
    for delivery_id in notifications.job_state_record(event):
        agent.send_notification(notifications.delivery_try, delivery_id, owner=event.get("owner_id"))


def deliver_notification(delivery_id: int) -> None:
    agent.send_notification(notifications.delivery_try, delivery_id,
                            owner=notifications.delivery_owner(delivery_id))

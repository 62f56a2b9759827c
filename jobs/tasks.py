"""RQ entry points: ids in, a service or the node agent out. Nothing else."""

from django.conf import settings

from jobs import agent, queues, services


def schedule() -> int:
    queues.wait_for_pass_slot(settings.SCHEDULER_MIN_PASS_GAP)
    return services.schedule_pass()


def launch_task(attempt_id: int) -> None:
    queues.launch_started(attempt_id)
    agent.current().runner.launch(attempt_id)


def stop_task(attempt_id: int) -> None:
    agent.current().runner.stop(attempt_id)

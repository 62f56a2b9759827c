"""The delivery repair sweep (notifications.deliveries_repair): deliveries a
dead worker left SENDING or PENDING, or whose retry a flushed Redis lost,
are put back on the queue and delivered, to a real webhook receiver on
loopback. Uses tests/test_notifications.py's receiver and private queue."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from jobs import queues
from jobs.models import NotificationDelivery
from jobs.services import notifications
from tests.test_notifications import SECRET, drain, receiver  # noqa: F401  (fixtures)

Status = NotificationDelivery.Status


def ours(found: list[int], user) -> list[int]:
    """The swept deliveries of this test's user: the suite's database holds
    other tests' deliveries too, which a sweep rightly picks up as well."""
    mine = set(NotificationDelivery.objects.filter(user=user).values_list("pk", flat=True))
    return sorted(pk for pk in found if pk in mine)


def one_delivery(alice, hook) -> NotificationDelivery:
    """A webhook delivery of a STOPPED event, stored but not yet tried."""
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    # What a worker stores before its first try (job_state_record), without the try.
    event = {"job_id": 0, "owner_id": alice.pk, "job_name": "x", "state": "STOPPED", "previous": "WAITING",
             "reason": "", "time": "2026-05-04T10:11:12.000Z"}
    return NotificationDelivery.objects.create(user=alice, channel=NotificationDelivery.Channel.WEBHOOK,
                                               payload=notifications._payload(event, alice.username),
                                               target=hook.url)


def test_a_delivery_left_sending_by_a_dead_worker_is_tried_again(drain, receiver, alice):
    hook = receiver()
    delivery = one_delivery(alice, hook)
    now = timezone.now()
    # Claimed by a worker that then died: SENDING, one try counted.
    NotificationDelivery.objects.filter(pk=delivery.pk).update(status=Status.SENDING, tries=1,
                                                               last_try_at=now - timedelta(minutes=1))
    assert ours(notifications.deliveries_repair(now=now, force=True), alice) == []  # could still be trying
    # Its try began longer ago than a try may take.
    NotificationDelivery.objects.filter(pk=delivery.pk).update(last_try_at=now - notifications.stuck_after())
    assert ours(notifications.deliveries_repair(force=True), alice) == [delivery.pk]
    drain()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.tries) == (Status.DELIVERED, 2)
    assert len(hook.wait(1)) == 1


def test_a_pending_delivery_and_a_lost_retry_are_sent(drain, receiver, alice):
    hook = receiver()
    pending = one_delivery(alice, hook)
    now = timezone.now()
    assert ours(notifications.deliveries_repair(now=now, force=True), alice) == []  # its worker may try it now
    lost = NotificationDelivery.objects.create(user=alice, channel=pending.channel, payload=pending.payload,
                                               target=hook.url, status=Status.RETRYING, tries=1,
                                               next_try_at=now - timedelta(minutes=5))
    found = ours(notifications.deliveries_repair(now=now + timedelta(minutes=2), force=True), alice)
    assert found == sorted([pending.pk, lost.pk])
    drain()
    assert set(NotificationDelivery.objects.filter(pk__in=found).values_list("status", flat=True)) == {Status.DELIVERED}


def test_a_stuck_delivery_past_its_last_retry_fails(drain, receiver, alice, settings):  # noqa: F811
    settings.WEBHOOK_RETRY_SECONDS = [10.0]
    delivery = one_delivery(alice, receiver())
    now = timezone.now()
    NotificationDelivery.objects.filter(pk=delivery.pk).update(status=Status.SENDING, tries=2, last_try_at=now)
    assert ours(notifications.deliveries_repair(now=now + notifications.stuck_after() + timedelta(seconds=1),
                                                force=True), alice) == []
    delivery.refresh_from_db()
    assert delivery.status == Status.FAILED and "gave up after 2 tries" in delivery.result


def test_one_agent_sweeps_at_a_time(drain, receiver, alice):
    notifications.deliveries_repair()  # takes the sweep's lock, unless an agent of the suite holds it now
    assert queues.connection().ttl(f"{settings.PAI_INSTANCE}:notify-repair") > 0
    pending = one_delivery(alice, receiver())
    # A sweep would find it now, but another holds the lock: none runs.
    assert notifications.deliveries_repair(now=timezone.now() + timedelta(minutes=2)) == []
    assert NotificationDelivery.objects.get(pk=pending.pk).status == Status.PENDING

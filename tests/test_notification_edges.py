"""Notifications at their edges: receivers that answer oddly, URLs beyond
ASCII, a retry queued twice, an e-mail address changed between tries.
Real receivers on 127.0.0.1 (the test processes allow 127.0.0.0/8,
tests/settings.py) and a real SMTP server (tests/test_notifications.py's)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import queues, services, webhooks
from jobs.models import NotificationDelivery, State
from jobs.services import notifications
from tests.cluster import free_port
from tests.raw_http import RawHttpServer
from tests.test_notifications import SECRET, drain, receiver, smtp, waiting_job, with_email  # noqa: F401  (fixtures)

Status = NotificationDelivery.Status


class RawReceiver(RawHttpServer):
    """A webhook receiver on 127.0.0.1 that answers `answer`, byte for byte,
    whatever it is."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@pytest.fixture
def raw_receiver():
    made: list[RawReceiver] = []

    def make(answer: bytes) -> RawReceiver:
        made.append(RawReceiver(answer))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.mark.parametrize("status", [b"99999999999999999999", b"2000", b"20"])
def test_a_status_code_of_other_than_three_digits_is_no_http_answer(raw_receiver, status):
    hook = raw_receiver(b"HTTP/1.1 " + status + b" OK\r\nContent-Length: 0\r\n\r\n")
    outcome = webhooks.post(hook.url, b"{}", {}, networks=["127.0.0.0/8"], timeout=5)
    assert (outcome.delivered, outcome.status) == (False, None)
    assert "did not answer HTTP" in outcome.message


@pytest.mark.parametrize(("answer", "delivered", "status"), [
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", True, 204),
    (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
     True, 200),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", False, 503),
])
def test_an_interim_answer_before_the_final_one_is_read_past(raw_receiver, answer, delivered, status):
    """A receiver may send 100 Continue or 103 Early Hints first: the
    delivery was judged by it, as refused and never tried again."""
    hook = raw_receiver(answer)
    outcome = webhooks.post(hook.url, b"{}", {}, networks=["127.0.0.0/8"], timeout=5)
    assert (outcome.delivered, outcome.status) == (delivered, status)


def test_interim_answers_alone_are_no_http_answer(raw_receiver):
    hook = raw_receiver(b"HTTP/1.1 100 Continue\r\n\r\n" * 20)
    outcome = webhooks.post(hook.url, b"{}", {}, networks=["127.0.0.0/8"], timeout=5)
    assert (outcome.delivered, outcome.retry) == (False, True) and "did not answer HTTP" in outcome.message


def test_a_receiver_answering_a_huge_status_code_leaves_no_delivery_sending(drain, raw_receiver, alice, settings):
    # Recording 99999999999999999999 as the response code failed (an integer
    # too large for the column), so the delivery stayed SENDING until the
    # repair sweep took its worker for dead.
    settings.WEBHOOK_RETRY_SECONDS = [60]
    hook = raw_receiver(b"HTTP/1.1 99999999999999999999 OK\r\nContent-Length: 0\r\n\r\n")
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert len(hook.requests) == 1
    assert (delivery.status, delivery.tries, delivery.response_code) == (Status.RETRYING, 1, None)
    assert "did not answer HTTP" in delivery.result


def test_a_url_with_letters_beyond_ascii_is_delivered_percent_encoded(receiver):
    # Taken when saved, but the request line was written as latin-1: "例"
    # could not be written at all ("not sent", never tried again) and "é"
    # went out as a bare byte no receiver reads as the URL's "é".
    hook = receiver()
    base = f"http://127.0.0.1:{hook.server.server_port}"
    for path in ("/hooks/例?team=é", "/hooks/café"):
        outcome = webhooks.post(base + path, b"{}", {}, networks=["127.0.0.0/8"], timeout=5)
        assert (outcome.delivered, outcome.status) == (True, 200), outcome.message
    assert [r["path"] for r in hook.requests] == ["/hooks/%E4%BE%8B?team=%C3%A9", "/hooks/caf%C3%A9"]


def test_an_international_domain_name_is_sent_as_its_ascii_form():
    target = webhooks.parse_url("https://Bücher.example:8443/x")
    assert (target.host, target.host_header) == ("xn--bcher-kva.example", "xn--bcher-kva.example:8443")
    with pytest.raises(ValueError, match="host"):
        webhooks.parse_url("https://" + "ü" * 70 + ".example/")


def test_a_retry_queued_twice_is_tried_once_and_then_waits(drain, receiver, alice, settings):
    # An overdue retry (the notify queue behind, agents away) is put on the
    # queue by the retry set and by the repair sweep, and again at every
    # sweep while it waits there. Each entry used to try it at once: a
    # receiver that was down took several tries back to back, the waits of
    # WEBHOOK_RETRY_SECONDS skipped, and was given up on early.
    settings.WEBHOOK_RETRY_SECONDS = [60, 60, 60]
    hook = receiver(statuses=(503, 503, 503))
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.tries) == (Status.RETRYING, 1)

    NotificationDelivery.objects.filter(pk=delivery.pk).update(next_try_at=timezone.now() - timedelta(minutes=2))
    assert queues.enqueue_due_notifications(now=time.time() + 61) == 1
    assert delivery.pk in notifications.deliveries_repair(force=True)
    assert delivery.pk in notifications.deliveries_repair(force=True)
    drain()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.tries) == (Status.RETRYING, 2)
    assert delivery.next_try_at > timezone.now() + timedelta(seconds=50)
    assert len(hook.requests) == 2


def test_an_email_retry_goes_to_the_address_the_account_has_then(drain, smtp, alice, settings):
    # A retry went to the address the account had when the job changed
    # state, for hours of retries after an admin had changed it (perhaps
    # because it was someone else's); a retried webhook uses the webhook as
    # it is then, and the Profile page says mail goes to the current address.
    down = free_port()
    up = settings.EMAIL_PORT
    settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = down, 2
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.STOPPED])
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.target) == (Status.RETRYING, alice.email)

    alice.email = "alice.new@example.org"
    alice.save(update_fields=["email"])
    settings.EMAIL_PORT = up
    NotificationDelivery.objects.filter(pk=delivery.pk).update(next_try_at=timezone.now())
    assert notifications.delivery_try(delivery.pk) == Status.DELIVERED
    assert [recipients for recipients, _message in smtp.messages] == [["alice.new@example.org"]]
    assert NotificationDelivery.objects.get(pk=delivery.pk).target == "alice.new@example.org"


@pytest.mark.parametrize("url", ["http://a..b/hook", "http://-a.example/hook", f"http://{'a' * 64}.example/hook",
                                 "http://.example/hook"])
def test_a_host_no_resolver_could_answer_is_refused_when_saved(alice, url):
    """Taken, then tried and retried for hours before being given up."""
    with pytest.raises(notifications.NotificationError, match="not a valid domain name"):
        notifications.webhook_set(user=alice, url=url, secret=SECRET)

"""The per-process memo of permission answers (jobs/services/permissions_memo.py):
what makes it forget, and what must not. Over HTTP, across processes, see
test_api.py's test_remembered_permissions_follow_every_change_at_once."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import transaction

from jobs.models import ApiToken, VirtualCluster
from jobs import queues
from jobs.services import permissions_memo, submission, tokens
from jobs.services.permissions_memo import permissions_changed, remembered

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _redis(redis_server) -> None:
    """The memo shares its generation number through Redis; without it nothing is kept."""


def counting(answer: str = "yes") -> tuple[Callable[[], str], list[int]]:
    calls: list[int] = []

    def ask() -> str:
        calls.append(1)
        return answer

    return ask, calls


def test_it_keeps_an_answer_until_a_change(alice):
    ask, calls = counting()
    key = ("test", alice.pk)
    assert remembered(key, ask) == remembered(key, ask) == "yes"
    assert len(calls) == 1
    alice.save(update_fields=["last_login"])  # a login changes nothing remembered
    remembered(key, ask)
    assert len(calls) == 1
    alice.first_name = "Alice"
    alice.save()
    remembered(key, ask)
    assert len(calls) == 2


def test_it_drops_an_answer_read_while_a_change_was_committing(alice):
    key = ("test", alice.pk)

    def ask_as_a_change_commits() -> str:
        permissions_changed()  # another process's change lands after the generation was read
        return "old"

    assert remembered(key, ask_as_a_change_commits) == "old"
    assert remembered(key, lambda: "new") == "new"


def test_it_never_keeps_a_refusal(alice):
    # New rows do not make the memo forget (nothing about them can be kept),
    # so these pass only because the refusals before them were not kept.
    name = f"later_{alice.username}"
    with pytest.raises(submission.SubmitError, match="does not exist"):
        submission.virtual_cluster_for(alice, name)
    VirtualCluster.objects.create(name=name, open_to_all=True)
    assert submission.virtual_cluster_for(alice, name).name == name

    made = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    ApiToken.objects.filter(pk=made.token.pk).update(key_hash="0" * 64)  # unknown for a moment
    with pytest.raises(tokens.TokenRejected, match="not valid"):
        tokens.token_authenticate(made.key)
    ApiToken.objects.filter(pk=made.token.pk).update(key_hash=made.token.key_hash)
    assert tokens.token_authenticate(made.key) == alice


def test_a_change_counts_inside_its_own_transaction_and_after_it_commits(alice):
    made = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    assert tokens.token_authenticate(made.key) == alice
    with transaction.atomic():
        assert tokens.token_revoke(token=made.token)
        with pytest.raises(tokens.TokenRejected, match="revoked"):
            tokens.token_authenticate(made.key)
    with pytest.raises(tokens.TokenRejected, match="revoked"):
        tokens.token_authenticate(made.key)


def test_each_caller_gets_its_own_user_and_cluster(alice):
    made = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    first = tokens.token_authenticate(made.key)
    first.first_name = "changed by one request"
    assert tokens.token_authenticate(made.key).first_name == alice.first_name
    vc = submission.virtual_cluster_for(alice, "default")
    vc.description = "changed by one request"
    assert submission.virtual_cluster_for(alice, "default").description != vc.description


def test_last_use_is_written_once_a_minute_per_process(alice):
    made = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    tokens.token_authenticate(made.key)
    first = ApiToken.objects.get(pk=made.token.pk).last_used_at
    assert first is not None
    tokens.token_authenticate(made.key)
    assert ApiToken.objects.get(pk=made.token.pk).last_used_at == first


def another_process_changes() -> None:
    """What another portal process's change does in Redis: bump the number
    and publish it. The PING after it answers only once Redis has written
    out everything before it, the message to this process included."""
    permissions_memo.publish_change()
    queues.connection().ping()


def redis_calls(command: str) -> int:
    stats = queues.connection().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_request_reads_the_generation_once_but_sees_its_own_changes(alice):
    ask, calls = counting()
    key = ("test", alice.pk)
    permissions_memo.request_started()
    try:
        remembered(key, ask)
        another_process_changes()  # mid-request
        remembered(key, ask)
        assert len(calls) == 1  # answered as of the request's first question
        permissions_changed()  # the request's own change
        remembered(key, ask)
        assert len(calls) == 2
    finally:
        permissions_memo.request_finished()
    another_process_changes()
    remembered(key, ask)
    assert len(calls) == 3  # outside a request, every call takes the changes published


def test_it_learns_of_changes_from_its_subscription_without_asking_redis(alice):
    ask, calls = counting()
    key = ("test", alice.pk)
    remembered(key, ask)
    gets = redis_calls("get")
    for _ in range(20):
        remembered(key, ask)
    # At most one read of the number, if a RECHECK_SECONDS ran out meanwhile.
    assert redis_calls("get") - gets <= 1
    assert len(calls) == 1
    another_process_changes()
    remembered(key, ask)
    assert len(calls) == 2


def test_a_change_published_while_its_subscription_was_down_is_not_missed(alice):
    ask, calls = counting()
    key = ("test", alice.pk)
    remembered(key, ask)
    name = permissions_memo.follower_name(os.getpid())
    ids = [client["id"] for client in queues.connection().client_list() if client["name"] == name]
    assert len(ids) == 1
    queues.connection().client_kill_filter(_id=ids[0])
    another_process_changes()  # nobody of this process hears it
    remembered(key, ask)  # the dead subscription is found: asked again, and followed anew
    remembered(key, ask)
    assert len(calls) == 3
    remembered(key, ask)
    assert len(calls) == 3  # following again: kept


def test_it_reads_the_number_again_when_no_message_came_for_a_while(alice, monkeypatch):
    """A subscription that died without a word (or a Redis emptied) is
    caught by reading the number itself now and then."""
    ask, calls = counting()
    key = ("test", alice.pk)
    monkeypatch.setattr(permissions_memo, "RECHECK_SECONDS", 3600.0)
    remembered(key, ask)
    queues.connection().incr(permissions_memo._generation_key())  # changed, and nothing published
    remembered(key, ask)
    assert len(calls) == 1  # not heard of yet
    monkeypatch.setattr(permissions_memo, "RECHECK_SECONDS", 0.0)
    remembered(key, ask)
    assert len(calls) == 2

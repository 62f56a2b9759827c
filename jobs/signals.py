"""Signal receivers: changes to who may do what drop the permissions memo,
and each request reads the memo's generation once.

Saves, deletes and membership changes made through the ORM (the admin, the
REST API, management commands) all arrive here; the few queryset UPDATEs on
these rows (token_revoke) call permissions_changed themselves.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission
from django.core.signals import request_finished, request_started
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from jobs.models import ApiToken, User, UserLimit, VirtualCluster
from jobs.services import permissions_memo, tokens

# A login writes last_login; nothing remembered depends on it, and a login
# must not make every process ask the database again.
_IRRELEVANT_UPDATES = frozenset({"last_login"})


@receiver(post_save, sender=User)
@receiver(post_save, sender=ApiToken)
@receiver(post_save, sender=VirtualCluster)
def _saved(sender: type, created: bool, update_fields: frozenset[str] | None, **kwargs: Any) -> None:
    # A new row cannot make a remembered answer wrong: answers are kept only
    # for rows that existed (an unknown token or cluster is never remembered).
    if created or (update_fields is not None and update_fields <= _IRRELEVANT_UPDATES):
        return
    permissions_memo.permissions_changed()


@receiver(post_save, sender=User)
def _password_changed(sender: type, instance: User, created: bool, **kwargs: Any) -> None:
    """Every way a password changes (the API, the Django admin's pages,
    Django's own `manage.py changepassword`, a shell) revokes the user's API
    tokens: a change or a reset is what follows a stolen password. A change
    through the API keeps the token it was made with (`keep_token_key`).
    set_password leaves the new password on the instance until save() has
    sent this signal."""
    if created or getattr(instance, "_password", None) is None:
        return
    tokens.tokens_revoke_all(user=instance, keep_key=getattr(instance, "keep_token_key", None))


@receiver(post_delete, sender=User)
@receiver(post_delete, sender=ApiToken)
@receiver(post_delete, sender=VirtualCluster)
# Deleting a group or a permission removes memberships and grants by
# cascade, which sends no m2m_changed: a group that made its members admins.
@receiver(post_delete, sender=Group)
@receiver(post_delete, sender=Permission)
def _deleted(sender: type, **kwargs: Any) -> None:
    permissions_memo.permissions_changed()


# Limits are remembered beside permissions (jobs/services/limits.py), and a
# new row changes an answer too: the default "no limit" was remembered.
@receiver(post_save, sender=UserLimit)
@receiver(post_delete, sender=UserLimit)
def _limit_changed(sender: type, **kwargs: Any) -> None:
    permissions_memo.permissions_changed()


# Who is a portal admin is a permission (User.is_admin): granted to a user,
# to a group the user is in, or given to a group.
@receiver(m2m_changed, sender=VirtualCluster.users.through)
@receiver(m2m_changed, sender=User.user_permissions.through)
@receiver(m2m_changed, sender=User.groups.through)
@receiver(m2m_changed, sender=Group.permissions.through)
def _membership_changed(sender: type, action: str, **kwargs: Any) -> None:
    if action.startswith("post_"):
        permissions_memo.permissions_changed()


@receiver(request_started)
def _request_started(sender: Any, **kwargs: Any) -> None:
    permissions_memo.request_started()


@receiver(request_finished)
def _request_finished(sender: Any, **kwargs: Any) -> None:
    permissions_memo.request_finished()

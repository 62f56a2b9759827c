"""Managing users (OpenPAI's PUT/DELETE/GET /user and virtual-cluster
membership). Admin checks are the caller's business; these functions check
the data and keep the rules that protect the cluster's history.

UserError.code follows OpenPAI's REST error names, like SubmitError.
"""

from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q

from jobs.models import ACTIVE_TASK_STATES, FINAL_STATES, Job, TaskAttempt, User, VirtualCluster, lock_user_row


class UserError(Exception):
    """A refusal with OpenPAI's code name; `status` where OpenPAI's differs
    from the code's usual one (jobs/api/errors.py)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class CurrentPasswordWrong(UserError):
    """oldPassword is not the user's password: a failed login to count."""

    def __init__(self) -> None:
        super().__init__("ForbiddenUserError", "oldPassword is not your current password.")


def _check_password(password: str, user: User) -> None:
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise UserError("InvalidParametersError", "password: " + " ".join(exc.messages)) from None


def user_create(*, username: str, password: str, admin: bool = False) -> User:
    user = User(username=username, is_staff=admin, is_superuser=admin)
    try:
        # Uniqueness is the database's (any case): a clash is a conflict, not bad input.
        user.full_clean(exclude=["password"], validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        messages = [f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items()]
        raise UserError("InvalidParametersError", "; ".join(messages)) from None
    _check_password(password, user)
    user.set_password(password)  # slow on purpose: before the transaction, not inside it
    conflict = UserError("ConflictUserError", f"User name {username} already exists.")
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError:  # the name in any case (jobs_user_username_any_case), perhaps made just now
        raise conflict from None
    return user


ADMIN_PERMISSION = ("jobs", "administer_portal")


def check_admin_change(*, user: User, admin: bool) -> None:
    """Admin rights held through a group are the group's to give: taking
    them away from the user alone is refused rather than answered as done."""
    if admin:
        return
    app_label, codename = ADMIN_PERMISSION
    groups = sorted(user.groups.filter(permissions__content_type__app_label=app_label,
                                       permissions__codename=codename).values_list("name", flat=True))
    if groups:
        raise UserError("ConflictUserError", f"User {user.username} is an admin through the group(s) "
                                             f"{', '.join(groups)}; take them out of it in the admin site first.")


def user_update(*, user: User, admin: bool) -> User:
    """Make `user` an admin or not. Taking it away also takes the explicit
    permission, which makes an admin as superuser does (User.is_admin)."""
    check_admin_change(user=user, admin=admin)
    with transaction.atomic():
        user.is_staff = user.is_superuser = admin
        user.save(update_fields=["is_staff", "is_superuser"])
        if not admin:
            user.user_permissions.remove(*user.user_permissions.filter(
                content_type__app_label=ADMIN_PERMISSION[0], codename=ADMIN_PERMISSION[1]))
    return user


def user_change_password(*, user: User, password: str, by: User, current_password: str | None = None,
                         keep_token_key: str | None = None) -> User:
    """Set a new password. Whoever changes their own (admins too) proves the
    current one: a stolen token or session alone must not take the account
    over. Afterwards every other token of the user is revoked (the caller's
    own, `keep_token_key`, stays) and their browser sessions end: Django
    drops a session whose password hash no longer matches on its next request."""
    if by.pk == user.pk or not by.is_admin:
        if current_password is None:
            raise UserError("InvalidParametersError", "oldPassword is required to change your own password.")
        if not user.check_password(current_password):
            raise CurrentPasswordWrong()
    _check_password(password, user)
    with transaction.atomic():
        # Under the lock token_create takes: a token is either made before
        # (and revoked here) or refused there (the password it was asked
        # with is no longer the user's).
        lock_user_row(user.pk)
        user.set_password(password)
        user.keep_token_key = keep_token_key  # the rest are revoked as it is saved (jobs/signals.py)
        user.save(update_fields=["password"])
    return user


def user_delete(*, user: User, by: User) -> None:
    """Delete a user with their finished jobs and tokens.

    Refused for admins (OpenPAI's rule; demote first), for oneself, and while
    the user has unfinished jobs: deleting those rows would orphan running
    containers.
    """
    if user.pk == by.pk:
        raise UserError("RemoveAdminError", "You cannot remove yourself.")
    if user.is_admin:
        raise UserError("RemoveAdminError", f"Admin {user.username} is not allowed to remove; make them a non-admin first.")
    user_delete_unless_busy(user=user)


def unfinished_jobs_of(users: list[User], *, limit: int = 100) -> list[Job]:
    """Some of the users' jobs that still hold (or wait for) a place in the
    cluster: enough to say why they may not be deleted yet."""
    holding = ~Q(state__in=FINAL_STATES) | Q(task_attempts__state__in=ACTIVE_TASK_STATES)  # ended, tasks stopping
    return list(Job.objects.filter(holding, owner__in=users).distinct().select_related("owner")[:limit])


def user_delete_unless_busy(*, user: User) -> None:
    """Delete a user with their finished jobs and tokens, refused while the
    user has unfinished jobs (the Django admin's way in, which may remove
    admins; user_delete adds OpenPAI's rules)."""
    with transaction.atomic():
        # The user's row, locked, before counting: a job the user submits
        # meanwhile either is counted (committed first) or fails its foreign
        # key check at commit (jobs/services/job_store.py: OwnerGone), never
        # is deleted with its owner after a 202.
        lock_user_row(user.pk)
        unfinished = Job.objects.filter(owner=user).exclude(state__in=FINAL_STATES).count()
        if unfinished:
            raise UserError("ConflictUserError",
                            f"User {user.username} has {unfinished} unfinished job(s); stop them before removing the user.")
        # A job that has ended may still be stopping its other tasks (the
        # verdict came from one of them): their rows hold the GPUs and ports
        # those containers still use until their exits are recorded.
        if TaskAttempt.objects.filter(job__owner=user, state__in=ACTIVE_TASK_STATES).exists():
            raise UserError("ConflictUserError",
                            f"User {user.username}'s last tasks are still stopping; try again in a few seconds.")
        user.delete()


def user_set_virtual_clusters(*, user: User, names: list[str]) -> list[VirtualCluster]:
    """Make `names` exactly the virtual clusters the user is a member of
    (those open to all stay open to them anyway)."""
    wanted = sorted({name.strip() for name in names if name.strip()})
    found = {vc.name: vc for vc in VirtualCluster.objects.filter(name__in=wanted)}
    missing = [name for name in wanted if name not in found]
    if missing:
        # OpenPAI answers a name in the request that names nothing with 400.
        raise UserError("NoVirtualClusterError", f"Virtual cluster {', '.join(missing)} is not found.", status=400)
    try:
        with transaction.atomic():
            user.virtual_clusters.set(found.values())
    except IntegrityError:  # a concurrent change added the same membership
        raise UserError("ConflictUserError", "The user's virtual clusters were changed meanwhile; try again.") from None
    return [found[name] for name in wanted]

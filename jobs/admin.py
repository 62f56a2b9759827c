"""Django admin: users, virtual clusters, nodes, jobs and their history."""

from __future__ import annotations


from django import forms
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin as BaseGroupAdmin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.models import Group
from django.contrib.auth.views import PasswordChangeView
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from jobs import keys, services
from jobs.login_forms import RateLimitedAdminLoginForm, RateLimitedAdminPasswordChangeForm
from jobs.models import (
    GPUS_EXAMPLE,
    ApiToken,
    GpuAllocation,
    Job,
    JobAttempt,
    Node,
    PortAllocation,
    SshKey,
    Task,
    TaskAttempt,
    TerminalSession,
    User,
    UserLimit,
    VirtualCluster,
)
from jobs.services import tokens, users
from jobs.services.nodes import node_active_tasks, node_address_clash, node_delete_unless_busy

# The admin's login counts failures like the portal's own login (one limit).
admin.site.login_form = RateLimitedAdminLoginForm


class _OwnPasswordChangeView(PasswordChangeView):
    form_class = RateLimitedAdminPasswordChangeForm

    def get_form_kwargs(self) -> dict:
        return {**super().get_form_kwargs(), "request": self.request}


def _own_password_change(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    """The admin site's own page where any staff user changes their password
    (AdminSite.password_change, with the old password under the failed-login
    limit)."""
    request.current_app = admin.site.name
    view = _OwnPasswordChangeView.as_view(
        success_url=reverse("admin:password_change_done", current_app=admin.site.name),
        extra_context={**admin.site.each_context(request), **(extra_context or {})})
    return view(request)  # the tokens go as the password is saved (jobs/signals.py)


# Read when the admin's URLs are built (portal/urls.py), after this module.
admin.site.password_change = _own_password_change  # type: ignore[method-assign]


# Who holds rights is for portal admins to say. Django lets whoever may
# change users tick these, their own included, and set anyone's password:
# a staff user given "change user" (to edit e-mails, deactivate accounts)
# made themselves a superuser, or signed in as one. Staff is no portal
# right (SECURITY.md, finding 13).
PRIVILEGE_FIELDS = ("is_staff", "is_superuser", "groups", "user_permissions")


def _holds_rights(user: User) -> bool:
    return user.is_staff or user.is_superuser or user.is_admin


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "is_staff", "is_active", "last_login")

    def get_readonly_fields(self, request: HttpRequest, obj: User | None = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_admin else fields + PRIVILEGE_FIELDS

    def has_change_permission(self, request: HttpRequest, obj: User | None = None) -> bool:
        """Only portal admins change (or reset the password of) another user
        who holds rights; anyone may keep their own row's other fields."""
        if obj is not None and obj.pk != request.user.pk and _holds_rights(obj) and not request.user.is_admin:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: User | None = None) -> bool:
        if obj is not None and _holds_rights(obj) and not request.user.is_admin:
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request: HttpRequest):
        """A user with unfinished jobs is shown as protected by them, so the
        admin refuses the delete, as DELETE /user does: the cascade would
        drop the rows of jobs whose containers still run."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        busy = [f"{job} ({job.get_state_display()}: stop it first)" for job in users.unfinished_jobs_of(list(objs))]
        return deleted, counts, perms_needed, [*protected, *busy]

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        users.user_delete_unless_busy(user=obj)  # checked again under the user's row lock

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        for user in queryset:
            users.user_delete_unless_busy(user=user)


admin.site.unregister(Group)


@admin.register(Group)
class GroupAdmin(BaseGroupAdmin):
    """A group's permissions are its members' rights: portal admins' to give."""

    def get_readonly_fields(self, request: HttpRequest, obj: Group | None = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_admin else fields + ("permissions",)


@admin.register(VirtualCluster)
class VirtualClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "capacity", "open_to_all", "description")
    filter_horizontal = ("users",)

    # "default" always exists (manage.py ensure_defaults makes it at start):
    # jobs that name no virtual cluster go there, and its share is what the
    # others leave. Renamed, it would keep its stored capacity as a share of
    # its own; deleted, submissions would fail until the next start. And
    # scheduling passes on PostgreSQL take turns by locking its row
    # (nodes.lock_passes): without it two could place at once.
    def get_readonly_fields(self, request: HttpRequest, obj: VirtualCluster | None = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields + ("name",) if obj is not None and obj.name == VirtualCluster.DEFAULT else fields

    def has_delete_permission(self, request: HttpRequest, obj: VirtualCluster | None = None) -> bool:
        if obj is not None and obj.name == VirtualCluster.DEFAULT:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(UserLimit)
class UserLimitAdmin(admin.ModelAdmin):
    """Per-user limits in a virtual cluster: a row without a user is the
    default for everyone there; a user's own row replaces it whole."""

    list_display = ("virtual_cluster", "who", "max_waiting_jobs", "max_running_jobs", "max_gpus")
    list_filter = ("virtual_cluster",)
    list_select_related = ("virtual_cluster", "user")
    search_fields = ("user__username", "virtual_cluster__name")
    autocomplete_fields = ("user",)

    @admin.display(description="user", ordering="user__username")
    def who(self, limit: UserLimit) -> str:
        return limit.user.username if limit.user else "(every user: the default)"


class NodeAdminForm(forms.ModelForm):
    """Node.clean keeps `gpus` and the port range as an agent registers
    them; the address is checked here as the agent checks its --address
    (a service's rule, which the model cannot import)."""

    class Meta:
        model = Node
        fields = "__all__"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "gpus" in self.fields:
            self.fields["gpus"].help_text = f"As the node agent registers them, e.g. {GPUS_EXAMPLE}; [] for none."

    def clean_address(self) -> str:
        address = self.cleaned_data["address"]
        clash = node_address_clash(address)
        if clash:
            raise forms.ValidationError(f"address: {clash}")
        return address


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeAdminForm
    list_display = ("name", "address", "status", "schedulable", "cpus", "memory_mb", "gpu_summary", "gpus_simulated", "last_heartbeat")
    list_filter = ("status", "schedulable", "gpus_simulated")
    # engine_marker decides which nodes share an engine (and its networks): the agent's to say.
    readonly_fields = ("engine_id", "engine_marker", "last_heartbeat", "registered_at", "agent_pid", "agent_host")

    def get_readonly_fields(self, request: HttpRequest, obj: Node | None = None) -> tuple[str, ...]:
        """A node keeps its name: its agent registers by name and takes its
        tasks from the queue named after it, so a renamed row would get
        tasks nobody starts (and the agent a second row)."""
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields + ("name",) if obj is not None else fields

    def get_deleted_objects(self, objs, request: HttpRequest):
        """A node with active tasks is shown as protected by them, so the
        admin refuses the delete (nodes.node_delete_unless_busy says why)."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        busy = [f"{node}: {count} active task(s) (drain it first)"
                for node, count in node_active_tasks(list(objs)).items()]
        return deleted, counts, perms_needed, [*protected, *busy]

    def delete_model(self, request: HttpRequest, obj: Node) -> None:
        node_delete_unless_busy(node=obj)  # checked again under the passes' lock

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            node_delete_unless_busy(node=node)

    @admin.display(description="GPUs")
    def gpu_summary(self, node: Node) -> str:
        return ", ".join(f"{len([g for g in node.gpus if g['type'] == t])}×{t}" for t in node.gpu_types) or "-"


# What ended a job or attempt (jobs/completion.py's trigger): recorded by the
# lifecycle when it ends, never edited.
EXIT_TRIGGER_FIELDS = ("exit_trigger_message", "exit_trigger_role", "exit_trigger_index")


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    fields = ("number", "state", "started_at", "finished_at", "exit_type", "exit_code", "exit_reason",
              *EXIT_TRIGGER_FIELDS)
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "virtual_cluster", "state", "submitted_at", "attempt_number", "total_tasks", "total_gpus")
    list_filter = ("state", "virtual_cluster")
    search_fields = ("name", "owner__username")
    # A job runs as its owner (their SSH keys in its containers, their
    # storage, their limits): moving one to another account is acting for
    # it, and jobs are made by submitting them (finding 26).
    readonly_fields = ("owner", "config_raw", "config", "warnings", "ssh_public_key", "submitted_at", "started_at",
                       "finished_at", *EXIT_TRIGGER_FIELDS)
    exclude = ("ssh_private_key", "secrets_sealed")
    inlines = [JobAttemptInline]
    actions = ["stop_jobs"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        """The trigger beside the exit fields, not at the end of the form
        where read-only fields go."""
        fields = [name for name in super().get_fields(request, obj) if name not in EXIT_TRIGGER_FIELDS]
        after = fields.index("exit_reason") + 1
        return [*fields[:after], *EXIT_TRIGGER_FIELDS, *fields[after:]]

    @admin.action(description="Stop the selected jobs")
    def stop_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        stopped = 0
        for job in queryset:
            try:
                services.job_stop(job=job, by=request.user)
                stopped += 1
            except services.JobStateError:
                pass
        self.message_user(request, f"asked {stopped} job(s) to stop")


@admin.register(TaskAttempt)
class TaskAttemptAdmin(admin.ModelAdmin):
    list_display = ("__str__", "node_name", "state", "exit_type", "exit_code", "started_at", "finished_at")
    list_filter = ("state", "exit_type", "node_name")
    raw_id_fields = ("task", "job_attempt", "job", "node")


admin.site.register(Task)
admin.site.register(GpuAllocation)
admin.site.register(PortAllocation)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are made by their users (the Profile page, the API), who alone
    see the secret. Here only the label changes, and a token can be revoked
    (the action): a staff user allowed to change tokens moved their own,
    whose secret they hold, to a superuser, extended it, or revived one."""

    list_display = ("prefix", "user", "label", "created_at", "expires_at", "revoked_at", "last_used_at")
    readonly_fields = ("key_hash", "prefix", "user", "created_at", "expires_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(tokens.token_revoke(token=token) for token in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).")


class SshKeyAdminForm(forms.ModelForm):
    """The key is checked as the Profile page checks it: what is stored is
    written into authorized_keys, where a second line or options before the
    key would grant more than the one key the page shows."""

    class Meta:
        model = SshKey
        fields = ("user", "title", "public_key")

    def clean_public_key(self) -> str:
        try:
            line, self.fingerprint = keys.check_public_key(self.cleaned_data["public_key"])
        except keys.BadPublicKey as exc:
            raise forms.ValidationError(f"public_key: {exc}") from None
        return line

    def save(self, commit: bool = True) -> SshKey:
        self.instance.fingerprint = self.fingerprint
        return super().save(commit)


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    """A key is authorized in its user's task containers: adding one to an
    account is signing in as it. Portal admins manage anyone's keys; other
    staff, whatever model permissions they hold, only their own (SECURITY.md,
    finding 26). The queryset hides others' keys (so their pages 404 and
    actions skip them) and the user field offers only oneself, so a crafted
    POST naming another user fails the form."""

    form = SshKeyAdminForm
    list_display = ("title", "user", "fingerprint", "created_at")
    readonly_fields = ("fingerprint", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[SshKey]:
        keys_ = super().get_queryset(request)
        return keys_ if request.user.is_admin else keys_.filter(user=request.user)

    def formfield_for_foreignkey(self, db_field, request: HttpRequest, **kwargs):
        if db_field.name == "user" and not request.user.is_admin:
            kwargs["queryset"] = User.objects.filter(pk=request.user.pk)
            kwargs["initial"] = request.user.pk
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: SshKey, form, change: bool) -> None:
        if obj.user_id != request.user.pk and not request.user.is_admin:
            raise PermissionDenied  # the form's choices already refuse it: a second lock
        super().save_model(request, obj, form, change)


@admin.register(TerminalSession)
class TerminalSessionAdmin(admin.ModelAdmin):
    """The browser terminal's audit log: read-only, kept as recorded."""

    list_display = ("user", "attempt", "started_at", "ended_at", "client_address", "end_reason")
    list_filter = ("started_at",)
    list_select_related = ("user", "attempt__task")
    search_fields = ("user__username", "attempt__job__name")
    readonly_fields = ("user", "attempt", "started_at", "ended_at", "client_address", "end_reason")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TerminalSession | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TerminalSession | None = None) -> bool:
        return False

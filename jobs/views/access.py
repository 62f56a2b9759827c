"""Interactive access to running tasks: the browser terminal, the job's SSH
key, and the user's own SSH public keys (on the profile page)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from jobs.models import Job, TaskAttempt
from jobs.services import access, webports
from jobs.views.jobs import job_for_user

# The add-key form's input survives the redirect back to the profile page
# when it is refused, so the user can fix it instead of pasting it again.
SSH_KEY_DRAFT = "ssh_key_draft"


class SshKeyForm(forms.Form):
    title = forms.CharField(max_length=100, required=False, help_text="Defaults to the key's comment.")
    public_key = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=16_000,
                                 help_text="One line, as in ~/.ssh/id_ed25519.pub")


def terminal(request: HttpRequest, job_id: int, attempt_id: int) -> HttpResponse:
    """The page holding the terminal; the shell itself comes over the
    WebSocket (jobs/terminal.py), which checks again who may open it. In
    another user's task (an admin's visit) the page names the owner and
    connects only when asked (finding 39): a link alone never puts an admin
    at a shell whose container, and whatever it prints, is the user's."""
    job = job_for_user(request, job_id)
    attempt = get_object_or_404(TaskAttempt.objects.select_related("task"), pk=attempt_id, job=job)
    running = access.terminal_ready(attempt)
    return render(request, "jobs/terminal.html", {"job": job, "attempt": attempt, "running": running,
                                                  "others_task": job.owner_id != request.user.pk})


@require_http_methods(["GET", "POST"])
def web_port(request: HttpRequest, job_id: int, attempt_id: int, port: int) -> HttpResponse:
    """Into a task's web port through the portal's proxy, for the job's
    owner or an admin: a page of the portal's that posts a one-time ticket
    to the task's own host name (jobs/services/webports.py); `?next=` is
    the path to land on. The owner goes straight on (the page posts itself)
    to "/" or to a path the portal's own link signed (`landing`). Anyone
    can send a link, so another path is shown first and opened only by the
    notice's form (finding 43), and an admin opening another user's port is
    told whose content it is (finding 36): both go on by a POST under the
    portal's CSRF check, so a link alone never lands anyone anywhere but
    their own app's start page."""
    job = job_for_user(request, job_id)
    attempt = get_object_or_404(TaskAttempt.objects.select_related("task"), pk=attempt_id, job=job)
    source = request.POST if request.method == "POST" else request.GET
    asked = source.get("next", "/")
    if len(asked) > webports.LANDING_MAX_CHARS:
        return HttpResponseBadRequest(f"The path to open (next) is longer than {webports.LANDING_MAX_CHARS} "
                                      "characters.", content_type="text/plain; charset=utf-8")
    next_path = webports.safe_next_path(asked)
    signed = webports.landing_signed(attempt_id=attempt.pk, port=port, path=asked,
                                     signature=request.GET.get("landing", ""))
    others_port = job.owner_id != request.user.pk
    context = {"job": job, "attempt": attempt, "port": port, "next_path": next_path, "others_port": others_port}
    if request.method != "POST" and (others_port or (next_path != "/" and not signed)):
        return _no_store(render(request, "jobs/web_port_notice.html", context))
    try:
        form = webports.web_port_enter_form(user=request.user, attempt_id=attempt.pk, port=port,
                                            next_path=next_path, secure=request.is_secure(),
                                            portal_host=request.get_host())
    except webports.WebPortUnavailable as exc:
        messages.error(request, f"Could not open port {port}: {exc}.")
        return redirect("jobs:detail", job.pk)
    response = _no_store(render(request, "jobs/web_port_enter.html", {**context, "form": form}))
    # The task host takes the ticket only with this page's Origin; under the
    # portal's same-origin referrer policy the browser would send "null".
    response["Referrer-Policy"] = "origin"
    return response


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


def ssh_key(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job's private key, for its owner only (not even admins)."""
    job = get_object_or_404(Job, pk=job_id)
    key = access.job_private_key(job=job, user=request.user)
    if key is None:
        raise Http404("no such job")
    response = HttpResponse(key, content_type="application/x-pem-file")
    response["Content-Disposition"] = f'attachment; filename="{access.ssh_key_file_name(job)}"'
    response["Cache-Control"] = "no-store"
    return response


@require_POST
def ssh_key_add(request: HttpRequest) -> HttpResponse:
    form = SshKeyForm(request.POST)
    if form.is_valid():
        try:
            key = access.ssh_key_add(user=request.user, title=form.cleaned_data["title"],
                                     public_key=form.cleaned_data["public_key"])
        except access.SshKeyError as exc:
            form.add_error(exc.field, exc.message)
        else:
            request.session.pop(SSH_KEY_DRAFT, None)
            messages.success(request, f'Added SSH key "{key.title}" ({key.fingerprint}). '
                                      "It is authorized in the jobs you start from now on.")
            return redirect("jobs:profile")
    request.session[SSH_KEY_DRAFT] = {"data": {k: request.POST.get(k, "")[:16_000] for k in ("title", "public_key")},
                                      "errors": {field: list(errors) for field, errors in form.errors.items()}}
    messages.error(request, "The SSH key was not added: " + "; ".join(
        f"{_label(form, field)}: {' '.join(errors)}" for field, errors in form.errors.items()))
    return redirect("jobs:profile")


def _label(form: forms.Form, field: str) -> str:
    return str(form.fields[field].label or field.replace("_", " ")) if field in form.fields else field


@require_POST
def ssh_key_delete(request: HttpRequest, key_id: int) -> HttpResponse:
    if not access.ssh_key_delete(user=request.user, key_id=key_id):
        raise Http404("no such key")
    messages.success(request, "Deleted the SSH key. Jobs already running keep it until they end.")
    return redirect("jobs:profile")


def ssh_keys_panel_context(request: HttpRequest) -> dict:
    """What templates/jobs/partials/profile_ssh_keys.html shows, for the
    profile view. A refused key's draft is shown once: this takes it out of
    the session."""
    draft = request.session.pop(SSH_KEY_DRAFT, None) or {}
    form = SshKeyForm(initial=draft.get("data") or None)
    return {"ssh_keys": list(request.user.ssh_keys.all()), "ssh_key_form": form,
            "ssh_key_errors": draft.get("errors") or {}}

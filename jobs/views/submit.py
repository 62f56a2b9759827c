"""Submit Job: the form (a view onto the config, edited in the browser), the
config box (v1 JSON or v2 YAML), and the validate endpoint the page calls as
the user types.

The page posts the whole config as text. Without JavaScript that text is a
plain textarea, so the basics work anyway; with it, the form fields edit the
same text. A rejected submit re-renders the page with the text as typed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods, require_POST

from jobs import forms, services, submit_draft
from jobs.ids import parse_id
from jobs.services import ratelimit
from jobs.spec import SpecError, SpecProblem
from jobs.views.jobs import job_for_user


@require_http_methods(["GET", "POST"])
def submit(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _submit_posted(request)
    clone = request.GET.get("clone", "")
    if clone:
        text = _clone_text(request, clone)
    else:
        text = submit_draft.dump(submit_draft.with_dirs(submit_draft.new_job_config(request.user), request.GET))
    return _render(request, submit_draft.check_draft(user=request.user, text=text), mode="form")


def _clone_text(request: HttpRequest, job_id: str) -> str:
    """Clone: the job's config as submitted, with a new name (owner or admin)."""
    number = parse_id(job_id)
    if number is None:
        raise Http404("no such job")
    job = job_for_user(request, number)
    text = submit_draft.clone_text(job, submit_draft.clone_name(request.user, job))
    query = {key: request.GET[key] for key in submit_draft.DIR_PREFILL_FIELDS if request.GET.get(key)}
    value = submit_draft.decoded(text) if query else None
    if isinstance(value, dict):  # the comments give way to the folders asked for
        text = submit_draft.dump(submit_draft.with_dirs(value, query))
    return text


def _submit_posted(request: HttpRequest) -> HttpResponse:
    form = forms.SubmitForm(request.POST)
    if not form.is_valid():
        # Only an oversized paste, or one holding a NUL, gets here: say why, keep the text.
        check = submit_draft.DraftCheck(text=request.POST.get("config", ""), problems=[forms.refusal(form)])
        return _render(request, check, mode="form" if request.POST.get("mode") == "form" else "json")
    text, mode = form.cleaned_data["config"], form.cleaned_data["mode"] or "json"
    try:
        job = services.job_submit(owner=request.user, config=text)
    except (SpecError, services.SubmitError) as exc:
        check = submit_draft.check_draft(user=request.user, text=text)
        if not check.problems:  # a race (the name was taken meanwhile) or storage trouble
            check.problems = submit_draft.locate(text, _problems_of(exc))
        return _render(request, check, mode=mode)
    messages.success(request, f'Job "{job.name}" is in the queue. It starts as soon as the cluster has room.')
    return redirect("jobs:list")


def _problems_of(exc: SpecError | services.SubmitError) -> list[SpecProblem]:
    if isinstance(exc, SpecError):
        return list(exc.problems)
    return [SpecProblem(exc.field, exc.message)]


def _render(request: HttpRequest, check: submit_draft.DraftCheck, *, mode: str) -> HttpResponse:
    user = request.user
    initial: dict[str, Any] = {**check.as_json(), "mode": mode}
    usable = submit_draft.usable_vcs(user)
    context = {
        "check": check,
        "initial": initial,
        "form": forms.SubmitForm(initial={"config": check.text, "mode": mode}),
        "vcs": usable,
        "default_vc": submit_draft.default_vc_name(user, usable),
        "gpu_types": submit_draft.gpu_types(),
        "images": submit_draft.recent_images(user),
        "panel": submit_draft.vc_panel(user, check),
    }
    return render(request, "jobs/submit.html", context)


@require_POST
def validate(request: HttpRequest) -> JsonResponse:
    """The page's live check: config text in (or, for a v2 draft edited in
    the form, the form's fields as JSON in `form`, and its YAML out in
    `text`); problems (with paths, lines, columns and form fields), warnings,
    the form's view of the config and the side panel out. Limited
    per user (LIVE_CHECKS_PER_MINUTE): each check parses up to 256 KB, and
    the page asks only when typing pauses, so a person never reaches it."""
    wait = ratelimit.action_wait_seconds(action="live-check", who=str(request.user.pk),
                                         limit=settings.LIVE_CHECKS_PER_MINUTE, window=60)
    if wait:
        response = JsonResponse({"throttled": True, "retryAfter": wait,
                                 "message": f"Too many checks; the next in {wait} seconds."}, status=429)
        response["Retry-After"] = str(wait)
        return response
    form = forms.SubmitForm(request.POST)
    text, cannot = form.cleaned_data["config"] if form.is_valid() else "", []
    if form.is_valid() and request.POST.get("form"):  # a v2 draft edited in the form: its YAML, from the fields
        text, cannot = submit_draft.form_text(request.POST["form"])
    if not form.is_valid() or text is None:
        problem = forms.refusal(form) if not form.is_valid() else SpecProblem("", f"v2 has no place for {', '.join(cannot)}")
        return JsonResponse({"syntaxOk": False, "value": None, "warnings": [], "panel": "",
                             "problems": [problem.as_dict()]})
    check = submit_draft.check_draft(user=request.user, text=text)
    panel = submit_draft.vc_panel(request.user, check)
    body = check.as_json()
    if not request.POST.get("form"):  # the page has the text it sent
        body.pop("text")
    body["verdict"] = panel["verdict"]
    body["panel"] = render_to_string("jobs/partials/submit_panel.html", {"panel": panel}, request=request)
    return JsonResponse(body)

"""Submit Job: the form (a view onto the config, edited in the browser), the
JSON box, and the validate endpoint the page calls as the user types.

The page posts the whole config as text. Without JavaScript that text is a
plain textarea, so the basics work anyway; with it, the form fields edit the
same text. A rejected submit re-renders the page with the text as typed.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods, require_POST

from jobs import forms, services
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
        text = forms.dump(forms.with_dirs(forms.new_job_config(request.user), request.GET))
    return _render(request, forms.check_draft(user=request.user, text=text), mode="form")


def _clone_text(request: HttpRequest, job_id: str) -> str:
    """Clone: the job's config as submitted, with a new name (owner or admin)."""
    if not job_id.isdigit():
        raise Http404("no such job")
    job = job_for_user(request, int(job_id))
    text = forms.clone_text(job, forms.clone_name(request.user, job))
    query = {key: request.GET[key] for key in forms.DIR_PREFILL_FIELDS if request.GET.get(key)}
    value = forms.decoded(text) if query else None
    if isinstance(value, dict):  # the comments give way to the folders asked for
        text = forms.dump(forms.with_dirs(value, query))
    return text


def _submit_posted(request: HttpRequest) -> HttpResponse:
    form = forms.SubmitForm(request.POST)
    if not form.is_valid():
        # Only an oversized paste gets here: say why, keep the text.
        check = forms.DraftCheck(text=request.POST.get("config", ""), problems=[
            SpecProblem("", " ".join(str(e) for errors in form.errors.values() for e in errors))
        ])
        return _render(request, check, mode="form" if request.POST.get("mode") == "form" else "json")
    text, mode = form.cleaned_data["config"], form.cleaned_data["mode"] or "json"
    try:
        job = services.job_submit(owner=request.user, config=text)
    except (SpecError, services.SubmitError) as exc:
        check = forms.check_draft(user=request.user, text=text)
        if not check.problems:  # a race (the name was taken meanwhile) or storage trouble
            check.problems = forms.locate(text, _problems_of(exc))
        return _render(request, check, mode=mode)
    messages.success(request, f'Job "{job.name}" is in the queue. It starts as soon as the cluster has room.')
    return redirect("jobs:list")


def _problems_of(exc: SpecError | services.SubmitError) -> list[SpecProblem]:
    if isinstance(exc, SpecError):
        return list(exc.problems)
    return [SpecProblem(exc.field, exc.message)]


def _render(request: HttpRequest, check: forms.DraftCheck, *, mode: str) -> HttpResponse:
    user = request.user
    initial: dict[str, Any] = {**check.as_json(), "mode": mode}
    usable = forms.usable_vcs(user)
    context = {
        "check": check,
        "initial": initial,
        "form": forms.SubmitForm(initial={"config": check.text, "mode": mode}),
        "vcs": usable,
        "default_vc": forms.default_vc_name(user, usable),
        "gpu_types": forms.gpu_types(),
        "images": forms.recent_images(user),
        "panel": forms.vc_panel(user, check),
    }
    return render(request, "jobs/submit.html", context)


@require_POST
def validate(request: HttpRequest) -> JsonResponse:
    """The page's live check: config text in; problems (with paths, lines and
    columns), warnings, the decoded config and the side panel out."""
    form = forms.SubmitForm(request.POST)
    if not form.is_valid():
        message = " ".join(str(e) for errors in form.errors.values() for e in errors)
        return JsonResponse({"syntaxOk": False, "value": None, "warnings": [], "panel": "",
                             "problems": [SpecProblem("", message).as_dict()]})
    check = forms.check_draft(user=request.user, text=form.cleaned_data["config"])
    panel = forms.vc_panel(request.user, check)
    body = check.as_json()
    body.pop("text")
    body["verdict"] = panel["verdict"]
    body["panel"] = render_to_string("jobs/partials/submit_panel.html", {"panel": panel}, request=request)
    return JsonResponse(body)

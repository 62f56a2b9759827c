"""Submit Job: the config text the page edits, and what is wrong with it.

The page edits one thing, the job config as JSON text (comments allowed);
the form fields are a view onto it in the browser. Every check is the spec
parser's (through `services.parse_for_user`) or mirrors one `job_submit`
makes before it writes, so the page can show all problems before Submit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.conf import settings
from django.utils import timezone

from jobs import jsonc, services, storage
from jobs.models import Job, Node, User, VirtualCluster
from jobs.services.cluster import VcUsage, config_fit, ready_node_states
from jobs.spec import MAX_CONFIG_BYTES, ParsedConfig, SpecError, SpecProblem
from jobs.templatetags.job_pages import num, percent_of

DIR_PREFILL_FIELDS = ("codeDir", "dataDir", "outputDir")


class SubmitForm(forms.Form):
    """What the page posts: the whole config as text, and which view the
    user was in (so a failed submit from the JSON box reopens it)."""

    config = forms.CharField(strip=False, required=False, max_length=MAX_CONFIG_BYTES, widget=forms.Textarea)
    mode = forms.ChoiceField(choices=[("form", "form"), ("json", "json")], required=False)

    def clean_config(self) -> str:
        # Browsers send a textarea's line breaks as CRLF whatever was typed
        # or pasted; store the text as the user sees it.
        return self.cleaned_data["config"].replace("\r\n", "\n")


# ------------------------------------------------------------ initial config


def new_job_config(user: User) -> dict[str, Any]:
    """A config that runs as is: the first job needs no reading."""
    stamp = timezone.localtime().strftime("%Y%m%d_%H%M%S")
    name = services.suggest_job_name(user, f"job_{stamp}")
    return {
        "jobName": name,
        "image": settings.SUBMIT_DEFAULT_IMAGE,
        "virtualCluster": default_vc_name(user),
        "taskRoles": [{
            "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 1024, "gpuNumber": 0,
            "command": 'echo "Hello from $PAI_JOB_NAME on $(hostname)"',
        }],
    }


def default_vc_name(user: User, usable: list[VirtualCluster] | None = None) -> str:
    """"default" if the user may use it (or nothing else), else their first;
    `usable` is usable_vcs(user) when the caller has it already."""
    names = [vc.name for vc in (usable_vcs(user) if usable is None else usable)]
    return VirtualCluster.DEFAULT if VirtualCluster.DEFAULT in names or not names else names[0]


def usable_vcs(user: User) -> list[VirtualCluster]:
    return list(VirtualCluster.objects.usable_by(user))


def with_dirs(config: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
    """The storage page links here with ?codeDir=&dataDir=&outputDir=."""
    for key in DIR_PREFILL_FIELDS:
        if query.get(key):
            config[key] = query[key]
    return config


def clone_name(owner: User, job: Job) -> str:
    """A free name near the cloned job's: exp -> exp_2, exp_2 -> exp_3."""
    base = job.name
    stripped = re.sub(r"_\d{1,4}$", "", base)
    if stripped != base and Job.objects.filter(owner=job.owner, name=stripped).exists():
        base = stripped
    return services.suggest_job_name(owner, base)


def clone_text(job: Job, new_name: str) -> str:
    """The job's config as submitted, comments and all, with a new jobName.

    Only the jobName string is replaced in the text; when that is not
    possible (it is missing or not a string) the stored config is used."""
    text = job.config_raw
    try:
        document = jsonc.loads(text)
        line, column = document.positions["jobName"]
        if not isinstance(document.value.get("jobName"), str):
            raise KeyError("jobName")
    except (jsonc.JsoncSyntaxError, KeyError, AttributeError):
        return dump({**job.config, "jobName": new_name})
    start = _offset(text, line, column)
    _, end = json.decoder.scanstring(text, start + 1, True)
    return text[:start] + json.dumps(new_name, ensure_ascii=False) + text[end:]


def _offset(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(part) + 1 for part in lines[: line - 1]) + column - 1


def decoded(text: str) -> Any:
    """The JSON value of `text` (comments allowed), or None if it is not JSON."""
    try:
        return jsonc.loads(text.removeprefix("\ufeff")).value
    except jsonc.JsoncSyntaxError:
        return None


def dump(config: dict[str, Any]) -> str:
    return json.dumps(config, ensure_ascii=False, indent=2)


# ------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Needs:
    """What the job asks of its virtual cluster, all tasks together."""

    tasks: int
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: str


@dataclass
class DraftCheck:
    text: str
    value: Any = None  # the decoded JSON when the text is JSON at all
    syntax_ok: bool = False
    problems: list[SpecProblem] = field(default_factory=list)
    warnings: list[SpecProblem] = field(default_factory=list)
    parsed: ParsedConfig | None = None

    @property
    def vc_name(self) -> str:
        value = self.value if isinstance(self.value, dict) else {}
        name = value.get("virtualCluster")
        return name if isinstance(name, str) and name else VirtualCluster.DEFAULT

    @property
    def needs(self) -> Needs | None:
        if self.parsed is None:
            return None
        spec = self.parsed.spec
        return Needs(
            tasks=spec.total_tasks, gpus=spec.total_gpus, gpu_type=spec.gpu_type or "",
            cpus=sum(r.task_number * r.cpu_number for r in spec.task_roles),
            memory_mb=sum(r.task_number * r.memory_mb for r in spec.task_roles),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "text": self.text, "value": self.value if self.syntax_ok else None, "syntaxOk": self.syntax_ok,
            "problems": [p.as_dict() for p in self.problems], "warnings": [w.as_dict() for w in self.warnings],
        }


def check_draft(*, user: User, text: str) -> DraftCheck:
    """Every problem `job_submit` would find in `text`, without storing anything."""
    check = DraftCheck(text=text)
    positions = None
    try:
        document = jsonc.loads(text.removeprefix("\ufeff"))
        check.value, positions = document.value, document.positions
        check.syntax_ok = True
    except jsonc.JsoncSyntaxError:
        pass
    try:
        check.parsed = services.parse_for_user(text, user=user)
        check.warnings = check.parsed.warnings
    except SpecError as exc:
        check.problems, check.warnings = list(exc.problems), list(exc.warnings)
    if isinstance(check.value, dict):
        check.problems += _submit_problems(user, check.value, check.parsed)
    check.problems = _located(check.problems, positions)
    return check


def _submit_problems(user: User, value: dict[str, Any], parsed: ParsedConfig | None) -> list[SpecProblem]:
    """The checks `job_submit` makes after parsing: virtual cluster, a free
    name, storage paths. Run on the raw value too, so they show at once."""
    problems: list[SpecProblem] = []
    vc_name = value.get("virtualCluster") or VirtualCluster.DEFAULT
    if isinstance(vc_name, str):
        try:
            services.virtual_cluster_for(user, vc_name)
        except services.SubmitError as exc:
            problems.append(SpecProblem(exc.field, exc.message))
    name = value.get("jobName")
    if isinstance(name, str) and Job.objects.filter(owner=user, name=name).exists():
        free = services.suggest_job_name(user, name)
        problems.append(SpecProblem("jobName", f'you already have a job named "{name}"; "{free}" is free'))
    if parsed is not None:
        for path, message in storage.check_job_paths(user_name=user.username, is_admin=user.is_admin, spec=parsed.spec):
            problems.append(SpecProblem(path, message))
    return problems


def locate(text: str, problems: list[SpecProblem]) -> list[SpecProblem]:
    """Give problems found after parsing (virtual cluster, storage) the line
    and column of their field, as the parser does for its own."""
    if all(p.line for p in problems):
        return problems
    try:
        positions = jsonc.loads(text.removeprefix("\ufeff")).positions
    except jsonc.JsoncSyntaxError:
        return problems
    return _located(problems, positions)


def _located(problems: list[SpecProblem], positions: dict[str, tuple[int, int]] | None) -> list[SpecProblem]:
    """`problems`, each without a line given its field's (or the nearest
    parent's) position; as they are when the text is not JSON."""
    if positions is None:
        return problems
    located = []
    for problem in problems:
        probe = problem.path
        while problem.line is None and probe not in positions and probe:
            probe = _parent(probe)
        if problem.line is None and probe in positions:
            problem = SpecProblem(problem.path, problem.message, *positions[probe])
        located.append(problem)
    return located


def _parent(path: str) -> str:
    """taskRoles[0].memoryMB -> taskRoles[0] -> taskRoles -> ''."""
    return re.sub(r"(\.[^.\[\]]+|\[\d+\]|^[^.\[\]]+)$", "", path)


# --------------------------------------------------------------- side panel


def gpu_types() -> list[tuple[str, int]]:
    """GPU types on ready nodes, with how many of each."""
    counts: dict[str, int] = {}
    for gpus in Node.objects.filter(status=Node.Status.READY, schedulable=True).values_list("gpus", flat=True):
        for gpu in gpus or []:
            counts[str(gpu["type"])] = counts.get(str(gpu["type"]), 0) + 1
    return sorted(counts.items())


def recent_images(user: User, limit: int = 8) -> list[str]:
    """Images for the image field's suggestions: the default, then the user's latest."""
    images = [settings.SUBMIT_DEFAULT_IMAGE]
    for config in Job.objects.filter(owner=user).order_by("-submitted_at").values_list("config", flat=True)[:50]:
        image = config.get("image") if isinstance(config, dict) else None
        if isinstance(image, str) and image not in images:
            images.append(image)
        if len(images) >= limit:
            break
    return images


def vc_panel(user: User, check: DraftCheck) -> dict[str, Any]:
    """What the side panel shows: the chosen virtual cluster's use now, and
    whether the job as written could fit."""
    name = check.vc_name
    states = ready_node_states()  # one read of the nodes for both the bars and the fit, per keystroke
    usage = next((u for u in services.vc_usage(states=states) if u.name == name), None)
    ready_nodes = Node.objects.filter(status=Node.Status.READY, schedulable=True).count()
    verdict, reason = "unknown", ""
    vc_ok = usage is not None and VirtualCluster.objects.usable_by(user).filter(name=name).exists()
    if check.parsed is not None and vc_ok:
        fit = config_fit(check.parsed.normalized, name, states=states)
        if ready_nodes == 0:
            verdict = "no-nodes"
        elif fit.never:
            verdict, reason = "never", fit.never.removeprefix("can never fit: ")
        elif fit.wait:
            verdict, reason = "wait", fit.wait
        else:
            verdict = "now"
    return {"usage": usage, "vc_name": name, "vc_ok": vc_ok, "verdict": verdict, "reason": reason,
            "ready_nodes": ready_nodes, "rows": _usage_rows(usage) if usage else [],
            "needs": _needs_words(check.needs) if check.needs else ""}


def _usage_rows(usage: VcUsage) -> list[dict[str, Any]]:
    """CPU, memory and each GPU type: used / total, as the panel's bars."""
    rows = [("CPUs", usage.cpus, num), ("Memory", usage.memory_mb, _megabytes)]
    rows += [(f"GPUs · {kind}", amount, num) for kind, amount in usage.gpus.items()]
    return [
        {"label": label, "used": fmt(amount.used), "total": fmt(amount.total),
         "percent": percent_of(amount.used, amount.total)}
        for label, amount, fmt in rows
    ]


def _needs_words(needs: Needs) -> str:
    gpus = "no GPUs" if not needs.gpus else _plural(needs.gpus, "GPU") + (f" ({needs.gpu_type})" if needs.gpu_type else "")
    return " · ".join([_plural(needs.tasks, "task"), _plural(needs.cpus, "CPU"), f"{_megabytes(needs.memory_mb)} memory", gpus])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _megabytes(value: float) -> str:
    # Not job_pages.mb: a share's fractional megabytes keep their decimal here ("341.3 MB").
    return f"{num(round(value / 1024, 1))} GB" if value >= 1024 else f"{num(value)} MB"


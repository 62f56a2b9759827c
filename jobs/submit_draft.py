"""Submit Job's draft: the config text the page edits, and what is wrong with it.

The page edits one thing, the job config as text: v1 JSON (comments
allowed) or v2 YAML, told apart and decoded by the spec package's entry
points (`read_config`, `parse_config_text`). The form fields are a view onto
it in the browser: a v1 config as it is, a v2 one through
jobs/spec/convert.py when the form can show it (the page says what it cannot
otherwise). What the page posts is jobs/forms.py's SubmitForm. Every check is the spec parser's (through
`services.parse_for_user`) or mirrors one `job_submit` makes before it
writes, so the page can show all problems before Submit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from jobs import jsonc, services, storage
from jobs.formatting import mb_share, num, percent_of, plural
from jobs.models import Job, Node, User, VirtualCluster
from jobs.services import limits
from jobs.services.admission import admission_problems
from jobs.services.cluster import VcUsage, config_fit, ready_node_states
from jobs.spec import ParsedConfig, SpecError, SpecProblem, convert, protocol_of, read_config, v2_text

DIR_PREFILL_FIELDS = ("codeDir", "dataDir", "outputDir")


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
    """The job's config as submitted, comments and all, with a new name.

    Only the name is replaced in the text. A v2 job's text is as stored:
    its secrets masked, to be typed again. When the name cannot be replaced
    (missing, not a string) a v1 job's normalized config is used, and a v2
    job's text is left as it is (the page then says the name is taken)."""
    text = job.config_raw
    try:
        document = read_config(text)
    except SpecError:
        document = None
    key = "name" if document is not None and document.protocol == 2 else "jobName"
    if document is None or not isinstance(document.value, dict) or not isinstance(document.value.get(key), str):
        return dump({**job.config, "jobName": new_name}) if protocol_of(text) == 1 else text
    if document.yaml is not None:  # a YAML scalar, plain, quoted or block: a JSON string is a YAML one too
        node = next(v for k, v in document.yaml.root.value if getattr(k, "value", None) == "name")
        start, end = node.start_mark.index, node.end_mark.index
        if node.style in ("|", ">"):  # its span ends at the start of a line: the next key stays on its own
            return text[:start] + json.dumps(new_name, ensure_ascii=False) + "\n" + text[end:]
    else:
        line, column = document.positions[key]
        start = _offset(text, line, column)
        _, end = json.decoder.scanstring(text, start + 1, True)
    return text[:start] + json.dumps(new_name, ensure_ascii=False) + text[end:]


def _offset(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(part) + 1 for part in lines[: line - 1]) + column - 1


def decoded(text: str) -> Any:
    """The value of a v1 `text` (comments allowed), or None if it is not that."""
    try:
        document = read_config(text.removeprefix("\ufeff"))
    except SpecError:
        return None
    return document.value if document.protocol == 1 else None


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
    protocol: int = 1
    value: Any = None  # what the form shows: the decoded v1 config, or a v2 one's form view (convert.py)
    document: Any = None  # the decoded text, in its own protocol
    syntax_ok: bool = False
    form_note: str = ""  # why the form cannot show this (v2) config
    problems: list[SpecProblem] = field(default_factory=list)
    warnings: list[SpecProblem] = field(default_factory=list)
    parsed: ParsedConfig | None = None

    @property
    def job_name(self) -> Any:
        value = self.document if isinstance(self.document, dict) else {}
        return value.get("name" if self.protocol == 2 else "jobName")

    @property
    def vc_name(self) -> str:
        value = self.document if isinstance(self.document, dict) else {}
        if self.protocol == 2:
            value = value.get("defaults") if isinstance(value.get("defaults"), dict) else {}
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

    def problem_dict(self, problem: SpecProblem) -> dict[str, Any]:
        """A problem for the page, with the form field it belongs to."""
        field = convert.form_path(problem.path, self.document) if self.protocol == 2 else problem.path
        return {**problem.as_dict(), "field": field}

    def as_json(self) -> dict[str, Any]:
        """What the page's script gets. The other protocol's text (for
        Export) only when this config can be said in it; a v2 config with
        secrets never can, so no secret is written out again."""
        other, other_note = converted_text(self)
        return {
            "text": self.text, "value": self.value if self.syntax_ok else None, "syntaxOk": self.syntax_ok,
            "protocol": self.protocol, "formNote": self.form_note, "otherText": other, "otherNote": other_note,
            "problems": [self.problem_dict(p) for p in self.problems],
            "warnings": [self.problem_dict(w) for w in self.warnings],
        }


def converted_text(check: DraftCheck) -> tuple[str | None, str]:
    """(the config in the other protocol, "") or (None, why it cannot be)."""
    if not check.syntax_ok:
        return None, "the config does not read as JSON or YAML yet"
    if check.protocol == 2:
        if check.value is None:
            return None, check.form_note
        return convert.v1_text(convert.v1_export(check.value)), ""
    value, cannot = convert.form_as_v2(check.value)
    if value is None:
        return None, f"v2 has no place for {', '.join(cannot)}"
    return convert.v2_text(convert.v2_export(value)), ""


def form_text(form_json: str) -> tuple[str | None, list[str]]:
    """The v2 YAML for the form's fields (posted as JSON) of a v2 draft, or
    (None, what cannot be said in v2; the caller words it as "v2 has no
    place for ...").

    Read by the v1 config reader, as the form's fields are a v1-shaped
    config: the same 32-level nesting limit (deeper would crash
    `json.loads` or the YAML writer), and no NUL or half surrogate pair,
    which the YAML written from them could not carry either."""
    try:
        fields = jsonc.loads(form_json).value
    except jsonc.JsoncSyntaxError as exc:
        return None, [f"form fields that do not read as JSON ({exc})"]
    value, cannot = convert.form_as_v2(fields)
    return (convert.v2_text(value), []) if value is not None else (None, cannot)


def check_draft(*, user: User, text: str) -> DraftCheck:
    """Every problem `job_submit` would find in `text`, without storing anything."""
    check = DraftCheck(text=text, protocol=protocol_of(text.removeprefix("\ufeff")))
    positions = None
    try:
        document = read_config(text.removeprefix("\ufeff"))
        check.document, positions, check.syntax_ok = document.value, document.positions, True
    except SpecError:
        pass
    if check.syntax_ok and check.protocol == 2:
        check.value, uses = convert.v2_as_form(check.document)
        check.form_note = convert.form_blocker_message(uses) if uses else ""
    elif check.syntax_ok:
        check.value = check.document
    try:
        check.parsed = services.parse_for_user(text, user=user)
        check.warnings = check.parsed.warnings
    except SpecError as exc:
        check.problems, check.warnings = list(exc.problems), list(exc.warnings)
    if isinstance(check.document, dict):
        check.problems += _masked_secrets(check) + _submit_problems(user, check)
    check.problems = _located(check.problems, positions)
    return check


def _masked_secrets(check: DraftCheck) -> list[SpecProblem]:
    """A clone of a v2 job shows its secrets masked: they must be typed again."""
    if check.protocol != 2:
        return []
    return [SpecProblem(f"secrets{path}", f"is masked ({v2_text.MASK}), as a cloned job's secrets are; type its value")
            for path, text in v2_text.secret_leaves(check.document.get("secrets")) if text == v2_text.MASK]


def _submit_problems(user: User, check: DraftCheck) -> list[SpecProblem]:
    """The checks `job_submit` makes after parsing: virtual cluster and the
    user's waiting limit there, a free name, fixed ports and the image's
    registry, storage paths. Run on the raw value too, so they show at once."""
    problems: list[SpecProblem] = []
    parsed = check.parsed
    vc_path, name_path = ("defaults.virtualCluster", "name") if check.protocol == 2 else ("virtualCluster", "jobName")
    vc_name = check.vc_name
    if isinstance(vc_name, str):
        try:
            vc = services.virtual_cluster_for(user, vc_name)
        except services.SubmitError as exc:
            problems.append(SpecProblem(vc_path if exc.field == "virtualCluster" else exc.field, exc.message))
        else:
            over = limits.waiting_limit_problem(user=user, vc=vc)
            if over:
                problems.append(SpecProblem(vc_path, over))
    name = check.job_name
    if isinstance(name, str) and Job.objects.filter(owner=user, name=name).exists():
        free = services.suggest_job_name(user, name)
        problems.append(SpecProblem(name_path, f'you already have a job named "{name}"; "{free}" is free'))
    if parsed is not None:
        problems += admission_problems(parsed.spec)
        for path, message in storage.check_job_paths(user_name=user.username, is_admin=user.is_admin, spec=parsed.spec):
            problems.append(SpecProblem(path, message))
    return problems


def locate(text: str, problems: list[SpecProblem]) -> list[SpecProblem]:
    """Give problems found after parsing (virtual cluster, storage) the line
    and column of their field, as the parser does for its own."""
    if all(p.line for p in problems):
        return problems
    try:
        positions = read_config(text.removeprefix("\ufeff")).positions
    except SpecError:
        return problems
    return _located(problems, positions)


def _located(problems: list[SpecProblem], positions: Any) -> list[SpecProblem]:
    """`problems`, each without a line given its field's (or the nearest
    parent's) position; as they are when the text does not decode."""
    if positions is None:
        return problems
    located = []
    for problem in problems:
        if problem.line is None:
            line, column = positions.nearest(problem.path)
            if line is not None:
                problem = SpecProblem(problem.path, problem.message, line, column)
        located.append(problem)
    return located



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
        fit = config_fit(check.parsed.spec, name, states=states)
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
    rows = [("CPUs", usage.cpus, num), ("Memory", usage.memory_mb, mb_share)]
    rows += [(f"GPUs · {kind}", amount, num) for kind, amount in usage.gpus.items()]
    return [
        {"label": label, "used": fmt(amount.used), "total": fmt(amount.total),
         "percent": percent_of(amount.used, amount.total)}
        for label, amount, fmt in rows
    ]


def _needs_words(needs: Needs) -> str:
    gpus = "no GPUs" if not needs.gpus else plural(needs.gpus, "GPU") + (f" ({needs.gpu_type})" if needs.gpu_type else "")
    return " · ".join([plural(needs.tasks, "task"), plural(needs.cpus, "CPU"), f"{mb_share(needs.memory_mb)} memory", gpus])

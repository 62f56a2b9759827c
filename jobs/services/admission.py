"""Checks a parsed config must pass before it is stored, beyond the config
language itself: things that depend on the cluster and the admin's settings.
`job_submit` refuses on them, and the Submit page shows them as the user
types (jobs/submit_draft.py), so both say the same.

- Fixed ports (`beginAt` > 0) must lie inside some node's task port range,
  or in FIXED_PORTS_ALLOWED: otherwise a job could bind any port of a node,
  such as the portal's or Redis's.
- Every image's registry (the job's, and a v2 task role's own) must not be
  the node itself, a link-local address (cloud metadata) or, unless
  REGISTRY_ALLOWED opens it, a private address.
"""

from __future__ import annotations

from django.conf import settings

from jobs.images import registry_of, registry_refusal
from jobs.models import Node
from jobs.spec import JobSpec, SpecProblem


def admission_problems(spec: JobSpec) -> list[SpecProblem]:
    return _fixed_port_problems(spec) + _image_problems(spec)


def _image_problems(spec: JobSpec) -> list[SpecProblem]:
    """Each distinct image once, at the first field that names it: `image`
    for the job's, `taskRoles.<name>.dockerImage` for a (v2) role's own."""
    images = {spec.image: "image"}
    for role in spec.task_roles:
        if role.image is not None:
            images.setdefault(role.image, f"taskRoles.{role.name}.dockerImage")
    problems = []
    for image, path in images.items():
        refusal = registry_refusal(registry_of(image), allowed=settings.REGISTRY_ALLOWED)
        if refusal:
            problems.append(SpecProblem(path, refusal))
    return problems


def _node_ranges() -> list[tuple[int, int]]:
    return sorted(set(Node.objects.values_list("port_start", "port_end")))


def _fixed_port_problems(spec: JobSpec) -> list[SpecProblem]:
    fixed = [(r, p, port) for r, role in enumerate(spec.task_roles) for p, port in enumerate(role.ports) if port.begin_at]
    if not fixed:
        return []
    ranges = _node_ranges()
    allowed = set(settings.FIXED_PORTS_ALLOWED)
    problems = []
    for role_index, port_index, port in fixed:
        wanted = port.fixed
        inside_a_node = any(start <= wanted[0] and wanted[-1] <= end for start, end in ranges)
        if inside_a_node or set(wanted) <= allowed:
            continue
        where = ", ".join(f"{start}-{end}" for start, end in ranges) or "none: no node has joined yet"
        shown = f"{wanted[0]}-{wanted[-1]}" if len(wanted) > 1 else str(wanted[0])
        problems.append(SpecProblem(
            f"taskRoles[{role_index}].portList[{port_index}].beginAt",
            f"expected fixed ports inside a node's task port range ({where}) or in the admin's FIXED_PORTS_ALLOWED, "
            f"got {shown}; or use beginAt 0 for any free ports"))
    return problems

"""Virtual clusters: their share of the cluster, what they use, their jobs."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from jobs.api import serializers
from jobs.api.auth import Access
from jobs.api.errors import ApiError
from jobs.api.http import handler, ok, resource
from jobs.models import VirtualCluster
from jobs.services import vc_usage


def _allowed(request: HttpRequest) -> set[str]:
    return set(VirtualCluster.objects.usable_by(request.user).values_list("name", flat=True))


@handler(Access.USER)
def _list(request: HttpRequest) -> HttpResponse:
    allowed = _allowed(request)
    return ok({usage.name: serializers.virtual_cluster(usage, allowed=usage.name in allowed) for usage in vc_usage()})


@handler(Access.USER)
def _show(request: HttpRequest, vc: str) -> HttpResponse:
    for usage in vc_usage():
        if usage.name == vc:
            return ok(serializers.virtual_cluster(usage, allowed=vc in _allowed(request)))
    raise ApiError("NoVirtualClusterError", f"Virtual cluster {vc} is not found.")


virtual_clusters = resource(GET=_list)
virtual_cluster = resource(GET=_show)

"""Virtual clusters: their share of the cluster, what they use, their jobs;
and the cluster's SKU types (GPU types), as OpenPAI's v2 lists them."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from jobs.api import serializers
from jobs.api.auth import Access
from jobs.api.errors import ApiError
from jobs.api.http import handler, ok, resource
from jobs.models import VirtualCluster
from jobs.services import vc_usage
from jobs.services.cluster import sku_types as cluster_sku_types


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


@handler(Access.USER)
def _sku_types(request: HttpRequest) -> HttpResponse:
    """OpenPAI's /cluster/sku-types[?vc=]: every signed-in user may read
    them, as they may read every virtual cluster."""
    vc = request.GET.get("vc") or None
    units = cluster_sku_types(vc=vc)
    if units is None:
        raise ApiError("NoVirtualClusterError", f"Virtual cluster {vc} is not found (the vc parameter).")
    return ok({kind: serializers.sku_type(unit) for kind, unit in units.items()})


virtual_clusters = resource(GET=_list)
virtual_cluster = resource(GET=_show)
sku_types = resource(GET=_sku_types)

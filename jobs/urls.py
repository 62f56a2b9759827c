"""Web UI routes (the REST API lives in jobs/api/urls.py).

Each feature's views live in their own module under jobs/views/.
"""

from django.urls import path

from jobs.views import account, cluster, storage
from jobs.views import jobs as job_views

app_name = "jobs"

urlpatterns = [
    # jobs
    path("", job_views.job_list, name="list"),
    path("submit/", job_views.submit, name="submit"),
    path("jobs/<int:job_id>/", job_views.detail, name="detail"),
    # cluster
    path("virtual-clusters/", cluster.virtual_clusters, name="virtual_clusters"),
    path("nodes/", cluster.nodes, name="nodes"),
    # storage
    path("storage/", storage.browse, name="storage"),
    # account
    path("profile/", account.profile, name="profile"),
    path("api-help/", account.api_help, name="api_help"),
]

"""Web UI routes (the REST API lives in jobs/api/urls.py).

Each feature's views live in their own module under jobs/views/.
"""

from django.urls import path

from jobs.views import access, account, cluster, dashboard, metrics, notifications, storage, submit
from jobs.views import job_logs
from jobs.views import nodes as node_views
from jobs.views import tokens as token_views
from jobs.views import jobs as job_views

app_name = "jobs"

urlpatterns = [
    # jobs
    path("", job_views.job_list, name="list"),
    path("submit/", submit.submit, name="submit"),
    path("submit/validate/", submit.validate, name="submit_validate"),
    path("jobs/<int:job_id>/", job_views.detail, name="detail"),
    path("jobs/rows/", job_views.job_list_rows, name="list_rows"),
    path("jobs/stop/", job_views.bulk_stop, name="bulk_stop"),
    path("jobs/<int:job_id>/live/", job_views.detail_live, name="detail_live"),
    path("jobs/<int:job_id>/stop/", job_views.stop, name="stop"),
    path("jobs/<int:job_id>/config/<str:kind>/", job_views.config_download, name="config_download"),
    path("jobs/<int:job_id>/tags/add/", job_views.tag_add, name="tag_add"),
    path("jobs/<int:job_id>/tags/remove/", job_views.tag_remove, name="tag_remove"),
    path("jobs/<int:job_id>/logs/<int:attempt_id>/<str:stream>/", job_logs.log_tail, name="log_tail"),
    path("jobs/<int:job_id>/logs/<int:attempt_id>/<str:stream>/search/", job_logs.log_search, name="log_search"),
    path("jobs/<int:job_id>/logs/<int:attempt_id>/<str:stream>/download/", job_logs.log_download, name="log_download"),
    # interactive access
    path("jobs/<int:job_id>/terminal/<int:attempt_id>/", access.terminal, name="terminal"),
    path("jobs/<int:job_id>/tasks/<int:attempt_id>/ports/<int:port>/", access.web_port, name="web_port"),
    path("jobs/<int:job_id>/ssh-key/", access.ssh_key, name="ssh_key"),
    path("profile/ssh-keys/add/", access.ssh_key_add, name="ssh_key_add"),
    path("profile/ssh-keys/<int:key_id>/delete/", access.ssh_key_delete, name="ssh_key_delete"),
    # cluster
    path("virtual-clusters/", cluster.virtual_clusters, name="virtual_clusters"),
    path("nodes/", cluster.nodes, name="nodes"),
    path("nodes/<int:node_id>/cordon/", node_views.cordon, name="node_cordon"),
    path("nodes/<int:node_id>/drain/", node_views.drain, name="node_drain"),
    path("nodes/<int:node_id>/uncordon/", node_views.uncordon, name="node_uncordon"),
    path("nodes/join-tokens/new/", node_views.join_token_create, name="node_join_token_create"),
    path("nodes/join-tokens/<int:token_id>/revoke/", node_views.join_token_revoke, name="node_join_token_revoke"),
    # storage
    path("storage/", storage.browse, name="storage"),
    path("storage/download/", storage.download, name="storage_download"),
    path("storage/folder/", storage.make_folder, name="storage_mkdir"),
    path("storage/upload/", storage.upload, name="storage_upload"),
    path("storage/delete/", storage.delete, name="storage_delete"),
    # account
    path("profile/", account.profile, name="profile"),
    path("api-help/", account.api_help, name="api_help"),
    # api tokens
    path("profile/tokens/new/", token_views.token_create, name="token_create"),
    path("profile/tokens/<int:token_id>/revoke/", token_views.token_revoke, name="token_revoke"),
    # notifications of job state changes
    path("profile/notifications/webhook/", notifications.webhook_save, name="webhook_save"),
    path("profile/notifications/webhook/delete/", notifications.webhook_delete, name="webhook_delete"),
    path("profile/notifications/email/", notifications.email_save, name="email_notifications_save"),
    # Prometheus
    path("metrics", metrics.metrics, name="metrics"),
    # the admin dashboard (usage over time)
    path("dashboard/", dashboard.dashboard, name="dashboard"),
]

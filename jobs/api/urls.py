"""REST API routes; included twice by portal/urls.py (/api/v1/ and
/rest-server/api/v1/), so reverse them through the request's namespace
(jobs/api/http.py: api_url).

Every route takes an optional trailing slash, as OpenPAI's server did, and
anything else under the prefix is a JSON 404 NoApiError.
"""

from django.urls import re_path

from jobs.api.http import no_api_view
from jobs.api.views import clusters, jobs, jobs_v2, root, tasks, tokens, usage, users, webhooks

JOB = r"user/(?P<username>[^/]+)/jobs/(?P<name>[^/]+)"
# OpenPAI's later v1 paths name a job by its framework name, <user>~<job>
# (its web portal's): the same views. Usernames hold no "~"; job names may.
FRAMEWORK_JOB = r"jobs/(?P<username>[A-Za-z0-9_]+)~(?P<name>[^/]+)"


def route(pattern: str, view, name: str):
    # The include's prefix ends in "/", so the root is the empty pattern.
    return re_path(rf"^{pattern}/?$" if pattern else r"^$", view, name=name)


urlpatterns = [
    route("", root.info, "info"),
    route(r"openapi\.json", root.description, "openapi"),
    route("token", tokens.token, "token"),
    route("authn/basic/login", tokens.token, "authn_basic_login"),  # OpenPAI's web portal and JS SDK log in here
    route("jobs", jobs.jobs, "jobs"),
    route(r"user/(?P<username>[^/]+)/jobs", jobs.user_jobs, "user_jobs"),
    route(FRAMEWORK_JOB, jobs.job, "framework_job"),
    route(FRAMEWORK_JOB + "/config", jobs.config, "framework_job_config"),
    route(FRAMEWORK_JOB + "/executionType", jobs.execution_type, "framework_job_execution_type"),
    route(FRAMEWORK_JOB + "/ssh", tasks.ssh, "framework_job_ssh"),
    # OpenPAI mounts its v2 job routes under v1's /jobs too, and its web
    # portal lists a job's retries from there.
    route(FRAMEWORK_JOB + "/job-attempts", jobs_v2.attempts, "framework_job_attempts"),
    route(FRAMEWORK_JOB + "/job-attempts/healthz", jobs_v2.attempts_health, "framework_job_attempts_health"),
    route(FRAMEWORK_JOB + r"/job-attempts/(?P<number>[^/]+)", jobs_v2.attempt, "framework_job_attempt"),
    route(JOB, jobs.job, "job"),
    route(JOB + "/config", jobs.config, "job_config"),
    route(JOB + "/executionType", jobs.execution_type, "job_execution_type"),
    route(JOB + "/ssh", tasks.ssh, "job_ssh"),
    route(JOB + "/ssh/key", tasks.ssh_key, "ssh_key"),
    route(JOB + r"/tasks/(?P<role>[^/]+)/(?P<index>[^/]+)/log", tasks.task_log, "task_log"),
    route(JOB + r"/tasks/(?P<role>[^/]+)/(?P<index>[^/]+)/metrics", usage.task_metrics, "task_metrics"),
    route("virtual-clusters", clusters.virtual_clusters, "virtual_clusters"),
    route(r"virtual-clusters/(?P<vc>[^/]+)", clusters.virtual_cluster, "virtual_cluster"),
    route("user", users.user, "user"),
    route(r"user/(?P<username>[^/]+)", users.user_detail, "user_detail"),
    route(r"user/(?P<username>[^/]+)/virtualClusters", users.user_virtual_clusters, "user_virtual_clusters"),
    route(r"user/(?P<username>[^/]+)/webhook", webhooks.webhook, "user_webhook"),
    re_path(r"^[\s\S]*$", no_api_view, name="no_api"),  # not ".": a path holding a newline too
]

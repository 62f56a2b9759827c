"""REST API v2 routes; included twice by portal/urls.py (/api/v2/ and
/rest-server/api/v2/), beside v1's (jobs/api/urls.py). A job is
`jobs/<user>~<name>`, as in OpenPAI's v2 API. Routes that v1 serves the same
way (stop, SSH, task logs) are v1's views under v2 paths; route names match
v1's so `api_url` builds links under the prefix a request came in by.
OpenPAI's v2 login, user and virtual cluster reads (its JS SDK's) are v1's
views too, but for a user, whose `virtualCluster` is a list in v2.
"""

from django.urls import re_path

from jobs.api.http import no_api_view
from jobs.api.urls import route
from jobs.api.views import jobs as jobs_v1
from jobs.api.views import clusters, jobs_v2, nodes, tasks, tokens, usage, users

JOB = r"jobs/(?P<username>[^/~]+)~(?P<name>[^/]+)"

urlpatterns = [
    route(r"openapi\.json", jobs_v2.description, "openapi"),
    route("authn/basic/login", tokens.token, "authn_basic_login"),
    route("jobs", jobs_v2.jobs, "jobs"),
    route(JOB, jobs_v2.job, "job"),
    route(JOB + r"/attempts/(?P<attempt_id>[^/]+)", jobs_v2.job_at_attempt, "job_at_attempt"),
    route(JOB + "/config", jobs_v2.config, "job_config"),
    route(JOB + "/executionType", jobs_v1.execution_type, "job_execution_type"),
    route(JOB + "/tag", jobs_v2.tag, "job_tag"),
    route(JOB + "/job-attempts", jobs_v2.attempts, "job_attempts"),
    route(JOB + "/job-attempts/healthz", jobs_v2.attempts_health, "job_attempts_health"),
    route(JOB + r"/job-attempts/(?P<number>[^/]+)", jobs_v2.attempt, "job_attempt"),
    route(JOB + "/ssh", tasks.ssh, "job_ssh"),
    route(JOB + "/ssh/key", tasks.ssh_key, "ssh_key"),
    route(JOB + r"/tasks/(?P<role>[^/]+)/(?P<index>[^/]+)/log", tasks.task_log, "task_log"),
    route(JOB + r"/tasks/(?P<role>[^/]+)/(?P<index>[^/]+)/metrics", usage.task_metrics, "task_metrics"),
    route(JOB + "/metrics", usage.job_metrics, "job_metrics"),
    route(JOB + "/metrics/summary", usage.job_metrics_summary, "job_metrics_summary"),
    route("virtual-clusters", clusters.virtual_clusters, "virtual_clusters"),
    route(r"virtual-clusters/(?P<vc>[^/]+)", clusters.virtual_cluster, "virtual_cluster"),
    route("cluster/sku-types", clusters.sku_types, "cluster_sku_types"),
    route("users", users.users_v2, "users"),
    route(r"users/(?P<username>[^/]+)", users.user_detail_v2, "user_detail"),
    # nodes (admins), join tokens (admins) and the join itself (a join token);
    # nodes/join comes first: GET /nodes/join is no node's page
    route("nodes", nodes.nodes_list, "nodes"),
    route("nodes/join", nodes.node_join, "node_join"),
    route(r"nodes/(?P<name>[^/]+)", nodes.node, "node"),
    route(r"nodes/(?P<name>[^/]+)/cordon", nodes.node_cordon, "node_cordon"),
    route(r"nodes/(?P<name>[^/]+)/drain", nodes.node_drain, "node_drain"),
    route(r"nodes/(?P<name>[^/]+)/uncordon", nodes.node_uncordon, "node_uncordon"),
    route("node-join-tokens", nodes.join_token_list, "node_join_tokens"),
    route(r"node-join-tokens/(?P<prefix>[^/]+)", nodes.join_token, "node_join_token"),
    re_path(r"^[\s\S]*$", no_api_view, name="no_api"),  # not ".": a path holding a newline too
]

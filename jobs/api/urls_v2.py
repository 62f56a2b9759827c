"""REST API v2 routes; included twice by portal/urls.py (/api/v2/ and
/rest-server/api/v2/), beside v1's (jobs/api/urls.py). A job is
`jobs/<user>~<name>`, as in OpenPAI's v2 API. Routes that v1 serves the same
way (stop, SSH, task logs) are v1's views under v2 paths; route names match
v1's so `api_url` builds links under the prefix a request came in by.
"""

from django.urls import re_path

from jobs.api.http import no_api_view
from jobs.api.urls import route
from jobs.api.views import jobs as jobs_v1
from jobs.api.views import jobs_v2, tasks

JOB = r"jobs/(?P<username>[^/~]+)~(?P<name>[^/]+)"

urlpatterns = [
    route(r"openapi\.json", jobs_v2.description, "openapi"),
    route("jobs", jobs_v2.jobs, "jobs"),
    route(JOB, jobs_v2.job, "job"),
    route(JOB + "/config", jobs_v2.config, "job_config"),
    route(JOB + "/executionType", jobs_v1.execution_type, "job_execution_type"),
    route(JOB + "/tag", jobs_v2.tag, "job_tag"),
    route(JOB + "/job-attempts", jobs_v2.attempts, "job_attempts"),
    route(JOB + r"/job-attempts/(?P<number>[^/]+)", jobs_v2.attempt, "job_attempt"),
    route(JOB + "/ssh", tasks.ssh, "job_ssh"),
    route(JOB + "/ssh/key", tasks.ssh_key, "ssh_key"),
    route(JOB + r"/tasks/(?P<role>[^/]+)/(?P<index>[^/]+)/log", tasks.task_log, "task_log"),
    re_path(r"^.*$", no_api_view, name="no_api"),
]

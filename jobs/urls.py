from django.urls import path

from jobs.views import jobs as job_views

app_name = "jobs"

urlpatterns = [
    path("", job_views.job_list, name="list"),
]

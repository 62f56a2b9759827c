"""The job list filtered by status and virtual cluster together, in its
order: an admin's page of 50 read from the index instead of every match
sorted (bench/job_list.py: 18,000 of 100,000 jobs on SQLite)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0013_job_run_time_sqlite_rounded"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["state", "virtual_cluster", "-submitted_at", "id"],
                               name="job_state_vc_recent_idx"),
        ),
    ]

"""What ended each job and job attempt, as OpenPAI's appExitTriggerMessage,
appExitTriggerTaskRoleName and appExitTriggerTaskIndex say it.

The columns are nullable so that each is an ALTER TABLE ADD COLUMN, on
SQLite too: a NOT NULL column with a default makes Django copy the table,
which would drop the name-search triggers of 0015 on jobs_job. Jobs that
ended before this migration keep NULL: which task ended them was not
recorded, and is not guessed from their exit_reason.
"""

from django.db import migrations, models


def _trigger_fields(model_name: str) -> list[migrations.AddField]:
    return [
        migrations.AddField(model_name=model_name, name="exit_trigger_index",
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name=model_name, name="exit_trigger_message",
                            field=models.TextField(blank=True, null=True)),
        migrations.AddField(model_name=model_name, name="exit_trigger_role",
                            field=models.CharField(blank=True, max_length=64, null=True)),
    ]


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0019_job_stop_requested_by_partial_index"),
    ]

    operations = [*_trigger_fields("job"), *_trigger_fields("jobattempt")]

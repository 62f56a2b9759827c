# The dashboard's windows read job and task attempts by their end
# (finished_at IS NULL OR finished_at >= the window's start): with these
# indexes a window reads what ended within it and what still runs, not the
# whole history.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0023_image_pull_waiting'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='jobattempt',
            index=models.Index(fields=['finished_at'], name='job_attempt_finished_idx'),
        ),
        migrations.AddIndex(
            model_name='taskattempt',
            index=models.Index(fields=['finished_at'], name='task_attempt_finished_idx'),
        ),
    ]

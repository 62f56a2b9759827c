# The per-job roll-up of whole minutes (JobUsageMinute) and its marks of
# minutes to roll up again (UsageMinuteMark). The samples already stored
# get a mark for each job attempt and minute they hold, so the first
# roll-ups take them in: one read of the samples' table, once.

import django.db.models.deletion
from django.db import migrations, models


def mark_stored_samples(apps, schema_editor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        minute = "CAST(FLOOR(EXTRACT(EPOCH FROM u.at) / 60) AS BIGINT)"
    else:  # 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC; the fraction does not change the minute
        minute = "(CAST(strftime('%%s', substr(u.at, 1, 19)) AS INTEGER) / 60)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_usageminutemark (job_id, number, minute, stamp) "
            f"SELECT DISTINCT a.job_id, a.number, {minute}, 0 FROM jobs_taskusage u "
            f"JOIN jobs_taskattempt a ON a.id = u.attempt_id", [])


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0024_attempt_finished_at_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobUsageMinute',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField(help_text='The job attempt.')),
                ('minute', models.BigIntegerField(help_text='Whole minutes since 1970-01-01 UTC.')),
                ('tasks', models.PositiveIntegerField(help_text='Tasks with a sample in the minute.')),
                ('cpu_sum', models.FloatField(help_text='Their CPU percent (each its mean) summed; 100 = one core.')),
                ('cpu_min', models.FloatField()),
                ('cpu_max', models.FloatField()),
                ('memory_sum', models.FloatField(help_text='Their memory in bytes (each its mean) summed.')),
                ('gpus', models.PositiveIntegerField(default=0, help_text='Their GPUs with figures.')),
                ('gpu_sum', models.FloatField(default=0.0, help_text="Those GPUs' utilisation percent (each its mean) summed.")),
                ('gpu_min', models.FloatField(blank=True, null=True)),
                ('gpu_max', models.FloatField(blank=True, null=True)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='jobs.job')),
            ],
            options={
                'indexes': [models.Index(fields=['minute'], name='job_usage_minute_idx')],
                'constraints': [models.UniqueConstraint(fields=('job', 'number', 'minute'), name='job_usage_minute_unique')],
            },
        ),
        migrations.CreateModel(
            name='UsageMinuteMark',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField(help_text='The job attempt.')),
                ('minute', models.BigIntegerField(help_text='Whole minutes since 1970-01-01 UTC.')),
                ('stamp', models.BigIntegerField()),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='jobs.job')),
            ],
            options={
                'indexes': [models.Index(fields=['minute'], name='usage_minute_mark_idx')],
                'constraints': [models.UniqueConstraint(fields=('job', 'number', 'minute'), name='usage_minute_mark_unique')],
            },
        ),
        migrations.RunPython(mark_stored_samples, migrations.RunPython.noop),
    ]

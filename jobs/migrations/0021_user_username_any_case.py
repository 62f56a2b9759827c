"""User names unique whatever their case, in the database.

Before, each way in (PUT /user, the command line, the Django admin) looked
for a clash before its INSERT, and two requests at once could both pass.
An expression index: on SQLite Django adds it without copying the table.
A database that already holds such a pair stops here with their names, to
be renamed by an admin first; nothing is changed or guessed.
"""

from django.db import migrations, models
from django.db.models import Count
from django.db.models.functions import Lower


def _refuse_existing_clashes(apps, schema_editor) -> None:
    User = apps.get_model("jobs", "User")
    clashes = (User.objects.annotate(folded=Lower("username")).values("folded")
               .annotate(n=Count("id")).filter(n__gt=1).values_list("folded", flat=True))
    names = sorted(User.objects.annotate(folded=Lower("username")).filter(folded__in=list(clashes))
                   .values_list("username", flat=True))
    if names:
        raise RuntimeError("these users' names differ only in case; rename all but one of each "
                           f"(Django admin, Users) and migrate again: {', '.join(names)}")


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("jobs", "0020_job_exit_trigger"),
    ]

    operations = [
        migrations.RunPython(_refuse_existing_clashes, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="user",
            constraint=models.UniqueConstraint(
                Lower("username"), name="jobs_user_username_any_case",
                violation_error_message="A user with that username already exists (in another case).",
            ),
        ),
    ]

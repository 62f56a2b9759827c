"""The models and the migrations agree: a model change without its
migration (an index added in Meta only, say) would leave databases made by
`migrate` without it, and benchmarks and tests would measure a schema no
install has."""

from __future__ import annotations

from django.core.management import call_command


def test_every_model_change_has_its_migration() -> None:
    # --check exits with an error when makemigrations would write one.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)

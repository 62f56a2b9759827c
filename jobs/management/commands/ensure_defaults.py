"""Create what must always exist: the "default" virtual cluster."""

from django.core.management.base import BaseCommand

from jobs.models import VirtualCluster


class Command(BaseCommand):
    help = 'Create the "default" virtual cluster if it is missing (safe to run repeatedly).'

    def handle(self, *args, **options) -> None:
        vc, created = VirtualCluster.objects.get_or_create(
            name=VirtualCluster.DEFAULT,
            defaults={"open_to_all": True, "capacity": 100.0, "description": "Every user's share of the cluster."},
        )
        if created and options["verbosity"]:
            self.stdout.write("created the default virtual cluster")

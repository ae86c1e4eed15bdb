# Usage outlives the conversation it was spent in: ModelRequest names its owner, and its run may go.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def owners_from_runs(apps, schema_editor):
    ModelRequest = apps.get_model("agents", "ModelRequest")
    Run = apps.get_model("agents", "Run")
    owner = Run.objects.filter(pk=OuterRef("run_id")).values("conversation__owner_id")[:1]
    ModelRequest.objects.update(owner_id=Subquery(owner))


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0014_run_queued_at"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="modelrequest",
            name="owner",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(owners_from_runs, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="modelrequest",
            name="owner",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="+", to=settings.AUTH_USER_MODEL
            ),
        ),
        migrations.AlterField(
            model_name="modelrequest",
            name="run",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="model_requests",
                to="agents.run",
            ),
        ),
    ]

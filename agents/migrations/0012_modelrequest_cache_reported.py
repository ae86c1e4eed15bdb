from django.db import migrations, models


def mark_unreported(apps, schema_editor):
    """Requests served by the local llama.cpp server, or whose usage was counted because the server
    sent none, never had cache figures: their stored zeros leave every cache ratio."""
    model_request = apps.get_model("agents", "ModelRequest")
    model_request.objects.filter(models.Q(run__provider="local") | ~models.Q(usage_source="reported")).update(
        cache_reported=False
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0011_modelrequest_estimated_parts"),
    ]

    operations = [
        migrations.AddField(
            model_name="modelrequest",
            name="cache_reported",
            field=models.BooleanField(default=True),
        ),
        migrations.RunPython(mark_unreported, migrations.RunPython.noop),
    ]

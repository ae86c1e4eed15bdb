import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0004_compaction_run"),
        ("toolcatalog", "0002_tool_server_missing_mcpcallcount"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="model",
            field=models.CharField(blank=True, max_length=128),
        ),
        migrations.AddField(
            model_name="conversation",
            name="mode",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="conversations",
                to="toolcatalog.mode",
            ),
        ),
    ]

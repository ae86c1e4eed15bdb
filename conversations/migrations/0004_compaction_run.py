import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0002_runtime"),
        ("conversations", "0003_compaction_view"),
    ]

    operations = [
        migrations.AddField(
            model_name="compaction",
            name="run",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="compactions",
                to="agents.run",
            ),
        ),
    ]

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("toolcatalog", "0002_tool_server_missing_mcpcallcount")]

    operations = [
        migrations.AlterModelOptions(
            name="retrievalmiss",
            options={"ordering": ["run", "id"], "verbose_name_plural": "retrieval misses"},
        ),
    ]

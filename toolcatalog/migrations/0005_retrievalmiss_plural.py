from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("toolcatalog", "0004_mcp_server_config")]

    operations = [
        migrations.AlterModelOptions(
            name="retrievalmiss",
            options={"ordering": ["run", "id"], "verbose_name_plural": "retrieval misses"},
        ),
    ]

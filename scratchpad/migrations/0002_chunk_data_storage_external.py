from django.db import migrations


def external_storage(apps, schema_editor):
    # Chunks are zlib-compressed already: PostgreSQL's TOAST compression would only
    # burn CPU on every put trying to shrink them (it halves put throughput).
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE scratchpad_chunk ALTER COLUMN data SET STORAGE EXTERNAL")


def extended_storage(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE scratchpad_chunk ALTER COLUMN data SET STORAGE EXTENDED")


class Migration(migrations.Migration):
    dependencies = [("scratchpad", "0001_initial")]

    operations = [migrations.RunPython(external_storage, extended_storage)]

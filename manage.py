#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
    from django.core.management import execute_from_command_line

    from controlcenter.env import ImproperEnvironment

    try:
        execute_from_command_line(sys.argv)
    except ImproperEnvironment as exc:
        # The message names the variable; a traceback through Django's settings import adds nothing.
        sys.exit(f"manage.py: {exc}")

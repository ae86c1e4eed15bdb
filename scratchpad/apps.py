from django.apps import AppConfig


class ScratchpadConfig(AppConfig):
    name = "scratchpad"

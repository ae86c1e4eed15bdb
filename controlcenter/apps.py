from django.apps import AppConfig


class ControlCenterConfig(AppConfig):
    name = "controlcenter"
    verbose_name = "Control Center"

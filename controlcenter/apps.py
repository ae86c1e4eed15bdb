from django.apps import AppConfig

from controlcenter.redact import configured_secrets, install_log_redaction


class ControlCenterConfig(AppConfig):
    name = "controlcenter"
    verbose_name = "Control Center"

    def ready(self) -> None:
        # Every process (web, worker, manage.py) loads this app: no log line of theirs carries a secret.
        install_log_redaction(configured_secrets())

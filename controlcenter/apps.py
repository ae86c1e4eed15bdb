from django.apps import AppConfig


class ControlCenterConfig(AppConfig):
    name = "controlcenter"
    verbose_name = "Control Center"

    def ready(self) -> None:
        from controlcenter.redact import configured_secrets, install_log_redaction

        # Every process (web, worker, manage.py) loads this app: no log line of theirs carries a secret.
        install_log_redaction(configured_secrets())

from django.apps import AppConfig


class ControlCenterConfig(AppConfig):
    name = "controlcenter"
    verbose_name = "Control Center"

    def ready(self) -> None:
        # Django's hook for work that needs the app registry loaded, which importing apps.py precedes.
        from controlcenter.redact import configured_secrets, install_log_redaction

        # Every process (web, worker, manage.py) loads this app: no log line of theirs carries a secret.
        install_log_redaction(configured_secrets())

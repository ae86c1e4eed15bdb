"""Set up a fresh installation; safe to run again (the run command calls it every time)."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from conversations.models import Conversation, Message
from toolcatalog.models import Mode
from toolcatalog.services import catalog_load_builtins

DEMO_TITLE = "Welcome to Control Center"
# Modes a fresh installation offers (UX-7), so the mode picker is never empty. Created once and
# never overwritten: an operator's edits in the admin stay. The shell always asks for approval.
# The two that change nothing list what they admit: their deny lists left multi_edit, apply_patch,
# delete_path, git_push and every tool imported later admitted (QA).
_DISCOVERY = ["search_tools", "describe_tool", "list_tool_groups"]
_READING = ["read_*", "search_*", "list_*", "get_*", "describe_*", "find_*", "glob", "file_info", "diff_files",
            "grep_code", "git_status", "git_log", "git_diff", "git_show_commit", "git_blame"]  # fmt: skip
_ANSWERING = ["ask_user", "final_answer", "context_usage"]
STARTER_MODES: list[tuple[str, str, list[str], list[str]]] = [
    (
        "chat",
        "Conversation only: memory and the web to read, no workspace, no shell, no writes.",
        [*_DISCOVERY, "search_memory", "list_memories", "web_search", "fetch_url", *_ANSWERING],
        [],
    ),
    ("code", "Everything: read, write and run commands (the shell asks for your approval).", ["*"], []),
    (
        "read-only",
        "Read the workspace and the catalog; nothing that changes a file, memory or the todo list.",
        [*_DISCOVERY, *_READING, *_ANSWERING],
        [],
    ),
]


class Command(BaseCommand):
    help = "Migrate, create the admin user, load the demo conversation and the built-in tools (idempotent)."

    def handle(self, *args: object, **options: object) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        username = os.environ.get("CC_ADMIN_USER", "admin")
        admin = self._ensure_admin(username)
        self._ensure_demo(admin)
        loaded = catalog_load_builtins()
        for name, description, allow, deny in STARTER_MODES:
            Mode.objects.get_or_create(name=name, defaults={"description": description, "allow": allow, "deny": deny})
        self.stdout.write(f"Built-in tools: {loaded.created} added to the catalog, {loaded.existing} already there.")
        self.stdout.write(self.style.SUCCESS("Control Center is set up."))

    def _ensure_admin(self, username: str):  # noqa: ANN202
        User = get_user_model()
        existing = User.objects.filter(username=username).first()
        if existing is not None:
            self.stdout.write(f"Admin user {username!r} already exists; its password is unchanged.")
            return existing
        password = os.environ.get("CC_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        admin = User.objects.create_superuser(username=username, email="", password=password)
        if os.environ.get("CC_ADMIN_PASSWORD"):
            self.stdout.write(f"Created admin user {username!r} with the password from CC_ADMIN_PASSWORD.")
        else:
            self.stdout.write(
                self.style.WARNING(f"Created admin user {username!r} with password {password!r} (shown only now).")
            )
        return admin

    @transaction.atomic
    def _ensure_demo(self, owner) -> None:  # noqa: ANN001
        if Conversation.objects.filter(owner=owner, title=DEMO_TITLE).exists():
            return
        conversation = Conversation.objects.create(owner=owner, title=DEMO_TITLE)
        question = Message.objects.create(
            conversation=conversation,
            role=Message.Role.USER,
            content=[{"type": "text", "text": "What is Control Center?"}],
        )
        answer = Message.objects.create(
            conversation=conversation,
            parent=question,
            role=Message.Role.ASSISTANT,
            content=[
                {
                    "type": "text",
                    "text": (
                        "Control Center runs LLM agents and manages what goes into their context window. "
                        "This installation uses the offline model until you configure a provider. "
                        "Ask me to list the files in the workspace to see a tool call."
                    ),
                }
            ],
        )
        conversation.tip = answer
        conversation.save(update_fields=["tip"])

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from toolcatalog.mcp_config import McpConfigError
from toolcatalog.models import McpServer
from toolcatalog.services import (
    CatalogFileInvalid,
    McpServerImportFailed,
    catalog_export,
    catalog_import,
    mcp_server_import,
    mcp_servers_import_file,
)


class Command(BaseCommand):
    help = (
        "Import a tool catalog file (all or nothing, idempotent), export the catalog in the same format, "
        "or import the tools of a configured MCP server."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        importing = sub.add_parser("import", help="import FILE; refuses the whole file if any tool is invalid")
        importing.add_argument("file")
        exporting = sub.add_parser("export", help="write the catalog as JSON to stdout or --output FILE")
        exporting.add_argument("--output", "-o", default="")
        from_mcp = sub.add_parser(
            "import-mcp",
            help="configure the servers of a Claude-Desktop-style --config FILE and import their tools, "
            "or refresh the tools of the configured server NAME (idempotent)",
        )
        from_mcp.add_argument("name", nargs="?", default="", help="the name of a configured MCP server")
        from_mcp.add_argument("--config", default="", help='a JSON file {"mcpServers": {NAME: {...}}}')

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "import-mcp":
            if bool(options["name"]) == bool(options["config"]):
                raise CommandError("import-mcp takes either a server NAME or --config FILE.")
            if options["config"]:
                self._import_mcp_file(Path(options["config"]))
            else:
                self._import_mcp(options["name"])
            return
        if options["action"] == "import":
            path = Path(options["file"])
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read {path}: {exc}") from exc
            try:
                result = catalog_import(text=text)
            except CatalogFileInvalid as exc:
                raise CommandError(f"{path}: {exc.message}") from exc
            self.stdout.write(
                f"{path}: {result.created} tools created, {result.updated} updated, {result.unchanged} unchanged, "
                f"{result.groups_created} groups created."
            )
            if result.not_in_file:
                shown = ", ".join(result.not_in_file[:10]) + (" …" if len(result.not_in_file) > 10 else "")
                self.stdout.write(
                    f"{len(result.not_in_file)} catalog tools are not in the file and were left as they are "
                    f"(disable or delete them in the admin): {shown}."
                )
            return
        text = catalog_export()
        if options["output"]:
            Path(options["output"]).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)

    def _import_mcp(self, name: str) -> None:
        server = McpServer.objects.filter(name=name).first()
        if server is None:
            known = ", ".join(McpServer.objects.values_list("name", flat=True)) or "none configured"
            raise CommandError(f"There is no MCP server named {name!r} (known: {known}).")
        try:
            result = mcp_server_import(server=server)
        except McpServerImportFailed as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{server.name}: {result.summary()}")

    def _import_mcp_file(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from exc
        try:
            outcomes = mcp_servers_import_file(text=text)
        except McpConfigError as exc:
            raise CommandError(f"{path}: {exc}") from exc
        failed = [outcome for outcome in outcomes if outcome.error]
        for outcome in outcomes:
            if outcome.error:
                self.stderr.write(f"{outcome.name}: not imported, nothing changed: {outcome.error}")
            elif outcome.result is None:
                self.stdout.write(f"{outcome.name}: saved (disabled, tools not imported).")
            else:
                verb = "added" if outcome.created else "updated"
                self.stdout.write(f"{outcome.name}: server {verb}; {outcome.result.summary()}")
        if failed:
            raise CommandError(f"{len(failed)} of {len(outcomes)} servers in {path} were not imported.")

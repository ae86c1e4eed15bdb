"""Wires the catalog-backed ToolBox for a run: surface, search index, built-in implementations.

The built-in implementations are reached only through `toolcatalog.builtins.BUILTINS`, so the
registry can be swapped for the full `toolcatalog/tools/` package in one place.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from engine.catalog.ranking import ToolIndex, index_for
from engine.catalog.semantic import hybrid_index_for
from engine.catalog.surface import ToolRecord
from engine.catalog.toolbox import ApprovalGate, CatalogToolBox, Executor, Observation, approval_pending
from toolcatalog.builtins import BUILTINS, ToolContext
from toolcatalog.selectors import run_surface


def builtin_executor(
    workspace: Path, conversation_id: int | None = None, user_id: int | None = None, cancel_key: Hashable | None = None
) -> Executor:
    """Runs the built-in tools, and forwards the imported MCP tools to their servers (MC-2)."""
    # The MCP SDK costs about 0.6 s at import: only a process that runs tools pays it, not the web
    # process drawing the Context view or answering /mcp's listings.
    from toolcatalog.mcp_client import mcp_executor

    context = ToolContext(root=workspace, conversation_id=conversation_id, user_id=user_id, cancel_key=cancel_key)
    forward = mcp_executor(workspace)

    def execute(name: str, arguments: dict[str, Any]) -> Observation | None:
        tool = BUILTINS.get(name)
        return forward(name, arguments) if tool is None else tool.call(arguments, context)

    return execute


def search_index(records: list[ToolRecord]) -> ToolIndex:
    """The ranker the settings choose, cached per catalog version; runs and /mcp both use it."""
    if settings.CC_TOOL_SEARCH_RANKER == "hybrid":
        return hybrid_index_for(records, cache_dir=settings.CC_TOOL_EMBEDDINGS_DIR)  # type: ignore[return-value]
    return index_for(records)


def run_toolbox(
    *,
    workspace: Path,
    conversation_id: int | None = None,
    user_id: int | None = None,
    mode: Any = None,
    deferral: bool | None = None,
    approve: ApprovalGate = approval_pending,
    pins: Mapping[str, Mapping[str, Any]] | None = None,
    cancel_key: Hashable | None = None,
) -> CatalogToolBox:
    surface, records = run_surface(mode=mode, deferral=deferral, pins=pins)
    index: list[ToolIndex] = []

    def run_index() -> ToolIndex:
        # Looked up once per run, on the first search; shared across runs per catalog version.
        if not index:
            index.append(search_index(records))
        return index[0]

    return CatalogToolBox(
        surface=surface,
        index=run_index,
        executor=builtin_executor(workspace, conversation_id, user_id, cancel_key),
        approve=approve,
        auto_approved=frozenset(settings.CC_TOOL_AUTO_APPROVE),
    )

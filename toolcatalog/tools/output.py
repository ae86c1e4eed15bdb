"""A mode's output actions: final_answer and submit_report return what ends the turn.

They do no work of their own; the observation carries `final: true` and the answer
or report, which the runtime (or an MCP client) takes as the turn's result.
"""

from __future__ import annotations

from typing import Any

from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin


def final_answer(arguments: dict[str, Any], context: ToolContext) -> Observation:
    if not arguments["text"].strip():
        raise ToolFailure("text is empty; the final answer must say something.")
    return {"ok": True, "final": True, "answer": {"text": arguments["text"], "sources": arguments.get("sources", [])}}


def submit_report(arguments: dict[str, Any], context: ToolContext) -> Observation:
    for field in ("title", "summary"):
        if not arguments[field].strip():
            raise ToolFailure(f"{field} is empty; a report needs a {field}.")
    report = {
        "title": arguments["title"],
        "summary": arguments["summary"],
        "status": arguments["status"],
        "findings": arguments.get("findings", []),
        "artifacts": arguments.get("artifacts", []),
    }
    missing = [path for path in report["artifacts"] if not _in_workspace(context, path)]
    if missing:
        raise ToolFailure(f"Artifacts not found in the workspace: {', '.join(missing)}.")
    return {"ok": True, "final": True, "report": report}


def _in_workspace(context: ToolContext, path: str) -> bool:
    with context.located(path, what="artifact") as artifact:
        return artifact.lstat() is not None


TOOLS = [builtin("final_answer", final_answer), builtin("submit_report", submit_report)]

"""Request checks and the API's error shapes.

Every refusal the emulator gives is an `ApiError` carrying the status, error type
and wording of the real API; the HTTP server renders it in the Anthropic or the
OpenAI error shape.
"""

from __future__ import annotations

from typing import Any

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class ApiError(Exception):
    """An error response, shaped like the real API's."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.code = code
        self.param = param

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def invalid_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


class StreamCut(Exception):
    """In process: the stream was cut mid-response (the HTTP server drops the connection)."""


def content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) and "type" in b for b in content):
        raise invalid_request(f"{where}: content must be a string or a list of typed blocks")
    return content


def check_cache_control(control: Any, where: str) -> None:
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise invalid_request(f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise invalid_request(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        if message.get("role") == "user":
            results = [
                (b, block.get("tool_use_id"))
                for b, block in enumerate(message["content"])
                if isinstance(block, dict) and block.get("type") == "tool_result"
            ]
            previous = messages[m - 1] if m > 0 else {}
            offered = {
                block.get("id")
                for block in (previous.get("content") if isinstance(previous.get("content"), list) else [])
                if previous.get("role") == "assistant" and isinstance(block, dict) and block.get("type") == "tool_use"
            }
            for b, tool_use_id in results:
                if tool_use_id not in offered:
                    raise invalid_request(
                        f"messages.{m}.content.{b}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{tool_use_id}. Each `tool_result` block must have a corresponding `tool_use` block "
                        "in the previous message."
                    )
        elif message.get("role") == "assistant":
            ids = [b.get("id") for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not ids:
                continue
            following = messages[m + 1] if m + 1 < len(messages) else {}
            answered = {
                b.get("tool_use_id")
                for b in (following.get("content") if isinstance(following.get("content"), list) else [])
                if following.get("role") == "user" and isinstance(b, dict) and b.get("type") == "tool_result"
            }
            missing = [i for i in ids if i not in answered]
            if missing:
                raise invalid_request(
                    f"messages.{m}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message."
                )

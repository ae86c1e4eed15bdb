"""The API's JSON parser: DRF's, with a bound on nesting (SB-5).

Python's json module recurses once per level, so a body of 100,000 `[` raised RecursionError,
a 500. Deep but parseable bodies are refused too: nothing in the API nests beyond a few levels,
and every later walk over the value (validation, storage, the engine) recurses again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from engine.nesting import nesting_depth


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        limit = settings.CC_MAX_JSON_DEPTH
        message = f"The JSON body nests deeper than {limit} levels (CC_MAX_JSON_DEPTH)."
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(message) from None
        if nesting_depth(data, limit) > limit:
            raise ParseError(message)
        return data

"""Long-term memory: save_memory and search_memory, one user's memories at a time.

PostgreSQL ranks with its full-text search (English stemming, any of the query's
words, ordered by ts_rank); the embedded SQLite mode falls back to a case-insensitive
word match ranked by how many query words a memory contains.
"""

from __future__ import annotations

import re
from datetime import UTC
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from toolcatalog.models import Memory
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin

DEFAULT_LIMIT = 10
MAX_MEMORY_CHARS = 10_000
MAX_SOURCE_CHARS = 500
_MAX_QUERY_WORDS = 32


def _words(query: str) -> list[str]:
    return list(dict.fromkeys(word.lower() for word in re.findall(r"\w+", query)))[:_MAX_QUERY_WORDS]


def save_memory(arguments: dict[str, Any], context: ToolContext) -> Observation:
    content = arguments["content"].strip()
    if not content:
        raise ToolFailure("content is empty; write the fact to remember.")
    if len(content) > MAX_MEMORY_CHARS:
        raise ToolFailure(
            f"content has {len(content)} characters; a memory holds at most {MAX_MEMORY_CHARS}. Save one fact."
        )
    if len(arguments.get("source", "")) > MAX_SOURCE_CHARS:
        raise ToolFailure(f"source is longer than {MAX_SOURCE_CHARS} characters; give an id, key or URL.")
    expires_at = None
    if arguments.get("expires_at"):
        expires_at = parse_datetime(arguments["expires_at"])
        if expires_at is None:
            raise ToolFailure(f"expires_at {arguments['expires_at']!r} is not an ISO 8601 date-time.")
        if timezone.is_naive(expires_at):
            expires_at = timezone.make_aware(expires_at, UTC)
        if expires_at <= timezone.now():
            raise ToolFailure(f"expires_at {arguments['expires_at']!r} is already past.")
    memory = Memory.objects.create(
        owner_id=context.owner_id(),
        conversation_id=context.conversation_id,
        scope=arguments.get("scope", Memory.Scope.USER),
        content=content,
        tags=list(dict.fromkeys(tag.strip() for tag in arguments.get("tags", []) if tag.strip())),
        source=arguments.get("source", ""),
        expires_at=expires_at,
    )
    return {"ok": True, "id": memory.pk, "scope": memory.scope, "tags": memory.tags, "saved": memory.content}


def live_memories(owner_id: int) -> QuerySet[Memory]:
    return Memory.objects.filter(owner_id=owner_id).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )


def _postgres_search(memories: QuerySet[Memory], words: list[str], tags: list[str], limit: int) -> list[Memory]:
    # Only PostgreSQL has this full-text search; an embedded installation (SQLite) never loads it.
    from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector

    query = SearchQuery(words[0], config="english")
    for word in words[1:]:
        query |= SearchQuery(word, config="english")
    vector = SearchVector("content", config="english", weight="A") + SearchVector(
        "source", config="english", weight="C"
    )
    if tags:
        memories = memories.filter(tags__contains=tags)
    ranked = memories.annotate(document=vector, score=SearchRank(vector, query)).filter(document=query)
    return list(ranked.order_by("-score", "-created_at")[:limit])


def _fallback_search(memories: QuerySet[Memory], words: list[str], tags: list[str], limit: int) -> list[Memory]:
    condition = Q()
    for word in words:
        condition |= Q(content__icontains=word) | Q(source__icontains=word)
    found = []
    for memory in memories.filter(condition):
        if tags and not set(tags) <= set(memory.tags):
            continue
        haystack = f"{memory.content} {memory.source}".lower()
        # `score` is what _postgres_search annotates; here it is computed, which the stubs cannot follow.
        memory.score = sum(1 for word in words if word in haystack) / len(words)  # type: ignore[attr-defined]
        found.append(memory)
    found.sort(key=lambda memory: (-memory.score, -memory.created_at.timestamp()))  # type: ignore[attr-defined]
    return found[:limit]


def search_memory(arguments: dict[str, Any], context: ToolContext) -> Observation:
    words = _words(arguments["query"])
    if not words:
        raise ToolFailure("query has no words to search for.")
    memories = live_memories(context.owner_id())
    scope = arguments.get("scope", "all")
    if scope != "all":
        memories = memories.filter(scope=scope)
    tags = arguments.get("tags", [])
    limit = arguments.get("limit", DEFAULT_LIMIT)
    search = _postgres_search if connection.vendor == "postgresql" else _fallback_search
    found = search(memories, words, tags, limit)
    observation: Observation = {
        "ok": True,
        "query": arguments["query"],
        "count": len(found),
        "memories": [
            {
                "id": memory.pk,
                "content": memory.content,
                "scope": memory.scope,
                "tags": memory.tags,
                "source": memory.source,
                "created_at": memory.created_at.isoformat(timespec="seconds"),
                "score": round(float(memory.score), 4),  # type: ignore[attr-defined]  # either search sets it
            }
            for memory in found
        ],
    }
    if not found:
        observation["_note"] = "No memory matches; try other words or a broader scope."
    return observation


TOOLS = [builtin("save_memory", save_memory), builtin("search_memory", search_memory)]

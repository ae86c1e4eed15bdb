"""What a turn sends: the one module that assembles a request's parts (TD-15).

Runs, subagents and the Context view all call it: the system blocks (prompt and the
deferred-name index), the toolbox stack the loop talks to, and the history from the
conversation's path (the latest compaction view plus what came after, compacted
proactively when it crosses the threshold, then pruned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from agents import approvals
from agents.models import ConversationToolPins, ModelRequest, Run, RunEvent
from agents.providers import get_provider
from agents.subagents import SPAWN_AGENTS, ChildDispatch, SpawningToolBox
from agents.summary import run_summarizer
from conversations import export, selectors
from conversations.compaction import CompactionPass, compaction_pass
from conversations.models import Compaction, Conversation, Message
from conversations.window import window_budget
from engine.catalog.pins import pinnable
from engine.catalog.toolbox import CatalogToolBox
from engine.context import ladder, transcript
from engine.context.calibration import Calibration, Measured, calibration_from
from engine.context.transcript import RequestCount
from engine.loop import MakeRoom, ReactiveCompaction, RequestSize, Room
from engine.providers.protocol import PromptTooLong, ProviderError
from engine.pruning import PruneResult, prune_stale_tool_output
from engine.request import ModelRequestSpec, called_tools, referenced_tools, text_block, tools_by_recency
from engine.room import turn_room
from engine.tokens import CHARS_PER_TOKEN, estimate_text_tokens, tool_prompt_tokens
from scratchpad.selectors import entries_visible_to_turn
from scratchpad.store import turn_toolbox
from toolcatalog.models import Mode
from toolcatalog.selectors import catalog_records, fit_surface_to_window, surface_context, tool_use_counts
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import workspace_root

SYSTEM_PROMPT = (
    "You are an agent running in Control Center. Work in the conversation's workspace with the tools "
    "you are given; say plainly what you did and what you found."
)


# A run in one of these holds the conversation: no new message or retry until it ends.
def turn_system(catalog: CatalogToolBox) -> list[dict[str, Any]]:
    """The system blocks: the prompt, then the deferred-name index (TD-2)."""
    return [text_block(SYSTEM_PROMPT), *catalog.surface.system_blocks()]


def turn_pruned(messages: list[dict[str, Any]]) -> PruneResult:
    """Stale tool output pruned in rare deep rewrites; between them requests only append (TD-12)."""
    return prune_stale_tool_output(
        messages, keep_turns=settings.CC_PRUNE_KEEP_TURNS, min_tokens=settings.CC_PRUNE_MIN_TOKENS
    )


def run_sandboxes(run_id: int) -> tuple[str, int]:
    """The key of a run's own sandboxes: its cancel kills these, not its children's."""
    return ("run", run_id)


def subagent_sandboxes(turn_id: str) -> tuple[str, str]:
    """The key of one child's sandboxes: its cancel kills these, not its siblings' or its parent's."""
    return ("subagent", turn_id)


def turn_toolboxes(
    *,
    run_id: int,
    conversation_id: int,
    owner_id: int | None,
    mode: Mode | None = None,
    children: ChildDispatch | None = None,
    take_pins: bool = True,
) -> tuple[CatalogToolBox, approvals.GatedToolBox]:
    """The run's catalog toolbox, and the stack the loop talks to, outermost first:

    approvals (RN-4: which calls wait for a person) -> scratchpad (SP-1, SP-7, SP-9:
    offload, `scratchpad_read`, references) -> subagents (TD-14: `spawn_agents`) ->
    catalog (TD-2..TD-8: resident set, deferred activation, built-in implementations).
    A run passes how its subagents are run; without it the stack is only described (Context view),
    and `take_pins=False` describes it without pinning the catalog for a conversation that never ran.
    `owner_id` is the conversation's owner: whose memories and task list the tools touch.
    """
    catalog = run_toolbox(
        workspace=workspace_root(conversation_id),
        conversation_id=conversation_id,
        user_id=owner_id,
        mode=mode,
        # The loop asks a person before a call that requires approval, so the catalog runs what it gets.
        approve=lambda tool, arguments: None,
        pins=conversation_tool_pins(conversation_id, take=take_pins),
        cancel_key=run_sandboxes(run_id),
    )
    # spawn_agents is a tool like any other to the mode: a mode that denies it never offers it (TD-8).
    spawning = (
        SpawningToolBox(catalog, run_id=run_id, children=children)
        if catalog.surface.mode.admits(SPAWN_AGENTS)
        else catalog
    )
    scratchpad = turn_toolbox(inner=spawning, run_id=run_id, conversation_id=conversation_id)
    stack = approvals.GatedToolBox(scratchpad)
    fit_surface_to_window(catalog, stack.schemas())  # LM-2: a small window gets a smaller resident set
    return catalog, stack


def subagent_toolboxes(
    *, conversation_id: int, owner_id: int | None, mode: Mode | None, parent_run_id: int, turn_id: str
) -> tuple[CatalogToolBox, approvals.GatedToolBox]:
    """A child's catalog toolbox and the stack over it: the parent run's surface (its mode,
    resident set and deferred index; TD-8), without `spawn_agents`, whatever the child's task or
    profile, so siblings send the same tools (TD-14) and the catalog's approval flags hold (RN-4).

    The scratchpad is in front, as in a run (SP-1): a large output is kept under the child's own
    `turn_id`, so it offers `scratchpad_read` only once it has an entry. A small window trims the
    resident set as the parent's (LM-2), by the tool calls counted when the parent run started:
    one count for every sibling, so their tools stay byte-identical whatever runs meanwhile.
    """
    catalog = run_toolbox(
        workspace=workspace_root(conversation_id),
        conversation_id=conversation_id,
        user_id=owner_id,
        mode=mode,
        # The loop asks a person before a call that requires approval, so the catalog runs what it gets.
        approve=lambda tool, arguments: None,
        pins=conversation_tool_pins(conversation_id),
        cancel_key=subagent_sandboxes(turn_id),
    )
    scratchpad = turn_toolbox(inner=catalog, run_id=parent_run_id, conversation_id=conversation_id, turn_id=turn_id)
    stack = approvals.GatedToolBox(scratchpad)
    started = (
        RunEvent.objects.filter(run_id=parent_run_id, type="run_started").order_by("-seq").values_list("pk", flat=True)
    ).first()
    fit_surface_to_window(catalog, stack.schemas(), uses=tool_use_counts(before_event=started))
    return catalog, stack


def conversation_tool_pins(conversation_id: int, *, take: bool = True) -> dict[str, Any] | None:
    """The imported tools as the conversation first saw them (MC-4); taken now at its first turn.

    Its later turns, and its subagents, build their surface from these definitions: an MCP
    server's refresh never rewrites the tools of a conversation already running. Not yet taken
    and not `take`: None, the catalog as it is (what the first turn would pin).
    """
    stored: dict[str, Any] | None = (
        ConversationToolPins.objects.filter(conversation_id=conversation_id).values_list("pins", flat=True).first()
    )
    if stored is not None or not take:
        return stored
    pins = pinnable(catalog_records())
    taken, _ = ConversationToolPins.objects.get_or_create(conversation_id=conversation_id, defaults={"pins": pins})
    return dict(taken.pins)


@dataclass(frozen=True)
class TurnContext:
    """The history a turn sends, and the compaction that produced it, if one ran now."""

    messages: list[dict[str, Any]]
    compaction: Compaction | None


def turn_context(
    *,
    trigger: Message,
    overhead: RequestCount,
    run: Run | None = None,
    summarize: Callable[[str], str] | None = None,
) -> TurnContext:
    """The history for a turn answering `trigger`: the latest compaction view on the path plus what came after.

    Compaction runs proactively (CH-2) when the whole request (history, system and tools:
    `overhead`) passes CC_COMPACT_AT_PERCENT of the context window, down to
    CC_COMPACT_TO_PERCENT, with the rungs that need no model call. The pass starts from the
    stored messages, not from the view it replaces (CH-11); its view is stored and reused by
    later turns, so a pass is one rewrite, not a different prefix at every turn. When those
    rungs cannot fit and `summarize` can call the provider, the pass climbs to the summary
    rung (CH-14).
    """
    history = selectors.history_view(conversation_id=trigger.conversation_id, tip_id=trigger.pk)
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    # Thresholds in the provider's units, brought to our estimate's by the last measured request (CH-12).
    images = transcript.provider_image_rule(run.provider if run else "")
    count = overhead + transcript.messages_count(history, image_rule=images)
    factor = calibration(conversation_id=trigger.conversation_id, model=run.model if run else "").factor(count)
    trigger_at = int(window * settings.CC_COMPACT_AT_PERCENT / 100 / factor)
    if count.total <= trigger_at:
        return TurnContext(history, None)
    target = max(1, int(window * settings.CC_COMPACT_TO_PERCENT / 100 / factor) - overhead.total)
    free: dict[str, Any] = {
        "conversation_id": trigger.conversation_id,
        "tip_id": trigger.pk,
        "target_tokens": target,
        "run": run,
        "image_rule": images,
    }
    # With a provider to call, a free pass that would leave the request past the trigger is not
    # kept: the summary rung is then the only one that can fit the window (CH-14).
    fits = trigger_at - overhead.total if summarize is not None else None
    done = compaction_pass(rungs=NO_CALL_RUNGS, trigger="proactive", fit_tokens=fits, **free)
    if fits is not None and done.compaction is None and done.result.tokens_after > fits:
        try:
            done = compaction_pass(
                rungs=(*NO_CALL_RUNGS, "summary"),
                trigger="proactive",
                summarize=summarize,
                summary_input_chars=summary_input_chars(),
                **free,
            )
        except ProviderError:
            # The summary is a convenience: without it the free rungs' view is still the best we have.
            done = compaction_pass(rungs=NO_CALL_RUNGS, trigger="proactive", **free)
    return TurnContext(done.view, done.compaction)


# How many of a conversation's latest answered requests calibrate its next estimate.
CALIBRATION_REQUESTS = 12


def measured_requests(*, conversation_id: int, model: str) -> list[Measured]:
    """The conversation's latest answered requests to `model`, oldest first: our count of each beside
    the prompt tokens the provider measured (CH-12). A subagent's requests are its own conversation's."""
    rows = (
        ModelRequest.objects.filter(
            run__conversation_id=conversation_id, model=model, subagent="", estimated_tokens__gt=0
        )
        # Our own count measures nothing: a request cut or lost before its usage came, or a server
        # that reports none and has no tokenizer to ask.
        .exclude(usage_source="estimate")
        .order_by("-id")
        .values_list(
            "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "estimated_tokens",
            "estimated_parts",
        )[:CALIBRATION_REQUESTS]
    )  # fmt: skip
    return [
        # Recorded before the parts were: all of it taken as the heuristic's.
        (RequestCount.from_dict(parts) if parts else RequestCount(messages=estimated), uncached + written + read)
        for uncached, written, read, estimated, parts in reversed(rows)
    ]


def calibration(*, conversation_id: int, model: str) -> Calibration:
    """What brings the next estimate of the conversation and `model` to the provider's units (CH-12):
    none before any request was answered."""
    return calibration_from(measured_requests(conversation_id=conversation_id, model=model))


# Overflow recovery never depends on a model call (CH-2): snapshots are always available.
NO_CALL_RUNGS = ("elide", "drop_images", "snapshot")
# Reactive recovery aims this far below the provider's stated maximum: its count was higher than ours once.
RECOVERY_MARGIN = 0.9


def recovery_limit(*, refused: int, estimated: int, maximum: int, fixed_tokens: int) -> int:
    """The history budget, in our estimate's units, that brings a refused request under the maximum (CH-12).

    The provider measured `refused` tokens where we estimated `estimated`: our count is scaled
    by that ratio, so the retry is below `maximum` with a margin by the provider's own count.
    `fixed_tokens` is what the retry sends besides the history (system, tools, this turn).
    """
    ratio = max(1.0, refused / estimated) if estimated > 0 else 1.0
    return int(maximum * RECOVERY_MARGIN / ratio) - fixed_tokens


def summary_input_chars() -> int:
    """The summary request's input cap: half the window, so the call fits the model it goes to (CH-14)."""
    return min(ladder.SUMMARY_INPUT_CHARS, settings.CC_CONTEXT_WINDOW_TOKENS // 2 * CHARS_PER_TOKEN)


def requested_compaction(run: Run, *, is_cancelled: Callable[[], bool]) -> CompactionPass:
    """The pass of a compaction run (CH-14, `/compact summary` and the API): the rungs it asked for over
    the path to its trigger, the summary by the run's (the conversation's) model, its cost recorded;
    `TurnCancelled` once `is_cancelled()` while the summary is written (OP-3)."""
    return compaction_pass(
        conversation_id=run.conversation_id,
        tip_id=run.trigger_id,
        rungs=run.compact_rungs or ladder.RUNGS,
        trigger="command",
        run=run,
        image_rule=transcript.provider_image_rule(run.provider),
        summarize=run_summarizer(run, get_provider(run.provider), is_cancelled=is_cancelled),
        summary_input_chars=summary_input_chars(),
    )


def reactive_compaction(
    *,
    trigger: Message,
    history: list[dict[str, Any]],
    limit_tokens: int,
    run: Run | None = None,
    target_tokens: int = 0,
    kind: str = "reactive",
) -> tuple[list[dict[str, Any]], Compaction] | None:
    """After the provider refused the prompt as too long (CH-2), or before a request our estimate says
    would not fit (LM-2, `kind="proactive"`): one pass from the stored messages, no model call, down to
    `target_tokens` (default: the limit); None if it cannot fit under `limit_tokens` or would send the
    same history again."""
    done = compaction_pass(
        conversation_id=trigger.conversation_id,
        tip_id=trigger.pk,
        rungs=NO_CALL_RUNGS,
        target_tokens=min(target_tokens, limit_tokens) if target_tokens > 0 else limit_tokens,
        trigger=kind,
        run=run,
        fit_tokens=limit_tokens,
        image_rule=transcript.provider_image_rule(run.provider if run else ""),
    )
    if done.compaction is None:
        return None
    return done.view, done.compaction


def turn_history(
    run: Run,
    *,
    overhead: RequestCount,
    emit: Callable[[str, dict[str, Any]], None],
    is_cancelled: Callable[[], bool] = lambda: False,
) -> list[dict]:
    """What the turn sends: the latest compaction view plus later messages (CH-2), then pruned (TD-12).
    A summary written on the way stops once `is_cancelled()` (`TurnCancelled`, OP-3)."""
    summarize = run_summarizer(run, get_provider(run.provider), is_cancelled=is_cancelled)
    context = turn_context(trigger=run.trigger, overhead=overhead, run=run, summarize=summarize)
    if context.compaction is not None:
        emit("compaction", compaction_event(context.compaction))
    pruning = turn_pruned(context.messages)
    if pruning.rewrote_now:
        emit("context_pruned", {"results_pruned": pruning.results_pruned, "tokens_freed": pruning.tokens_freed})
    return pruning.messages


def compaction_event(compaction: Any) -> dict[str, Any]:
    return {
        "trigger": compaction.trigger,
        "rung": compaction.rung,
        "tokens_before": compaction.tokens_before,
        "tokens_after": compaction.tokens_after,
    }


def reactive_compaction_hook(
    run: Run, emit: Callable[[str, dict[str, Any]], None], *, overhead: Callable[[], RequestCount]
) -> ReactiveCompaction:
    """The loop's prompt-too-long hook: one ladder pass without a model call, recorded like any other (CH-2).

    `overhead` counts what the request sends besides its messages (system, tools resident
    and loaded), read when the refusal comes, so the retry's budget leaves room for them.
    """

    def compact(history: list[dict[str, Any]], turn: list[dict[str, Any]], error: PromptTooLong) -> list | None:
        maximum = error.maximum or settings.CC_CONTEXT_WINDOW_TOKENS
        images = transcript.provider_image_rule(run.provider)
        fixed = overhead().total + transcript.transcript_tokens(turn, image_rule=images)
        history_tokens = transcript.transcript_tokens(history, image_rule=images)
        estimated = fixed + history_tokens
        refused = error.tokens or estimated
        limit = recovery_limit(refused=refused, estimated=estimated, maximum=maximum, fixed_tokens=fixed)
        # Never the same request again: without a measured size, the history must shrink by the margin too.
        limit = min(limit, int(history_tokens * RECOVERY_MARGIN))
        if limit <= 0:
            return None
        compacted = reactive_compaction(trigger=run.trigger, history=history, limit_tokens=limit, run=run)
        if compacted is None:
            return None
        view, compaction = compacted
        emit("compaction", compaction_event(compaction))
        return view

    return compact


# A request may fill this share of the window with its prompt (by our calibrated estimate) and the
# reply it asks room for; the rest absorbs what the calibration still misses (LM-2).
FIT_SHARE = 0.95


def room_making_hook(run: Run, emit: Callable[[str, dict[str, Any]], None], *, max_tokens: int) -> MakeRoom:
    """The loop's check before every request (LM-2): the prompt and the reply's room stay inside the window.

    The turn-start check (`turn_context`) sees the history before the turn adds its tool results
    and the tools it loads; this one sees each request as it will be sent. Past the window, one
    ladder pass without a model call shrinks the history; if the pass cannot free enough (the
    turn's own messages and the tool block are not the ladder's to shrink), the reply is asked
    for in the room that is left, never less than `min_output` tokens. Our estimate is brought
    to the provider's units by the conversation's measured requests and the turn's own (CH-12).
    """
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    min_output = min(max_tokens, max(64, window // 32))
    measured = measured_requests(conversation_id=run.conversation_id, model=run.model)

    def make_room(history: list[dict[str, Any]], turn: list[dict[str, Any]], size: RequestSize) -> Room | None:
        factor = calibration_from([*measured, *size.measured]).factor(size.count)
        if size.estimated * factor + max_tokens <= window * FIT_SHARE:
            return None
        fixed = size.estimated - size.history
        limit = int((window * FIT_SHARE - max_tokens) / factor) - fixed
        # Down to the compaction target when the tool block leaves room for it, so the next steps need no pass.
        target = int(window * settings.CC_COMPACT_TO_PERCENT / 100 / factor) - fixed
        compacted = reactive_compaction(
            trigger=run.trigger, history=history, limit_tokens=limit, target_tokens=target, run=run, kind="proactive"
        ) if limit > 0 else None  # fmt: skip
        if compacted is not None:
            view, compaction = compacted
            emit("compaction", compaction_event(compaction))
            return Room(history=view)
        room = int(window * FIT_SHARE - size.estimated * factor)
        return Room(max_tokens=max(min_output, min(max_tokens, room)))

    return make_room


def subagent_room_hook(parent: Run, emit: Callable[[str, dict[str, Any]], None], *, max_tokens: int) -> MakeRoom:
    """A subagent's check before every request (LM-2): the parent's rule (`room_making_hook`) on a
    context that is only the child's task and turn, which has no stored path to compact: past the
    window its older tool results are sent as stubs, then the reply gets the room that is left
    (`engine.room.turn_room`). Calibrated as the parent's: by the conversation's measured requests
    and the child's own earlier ones (CH-12).
    """
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    min_output = min(max_tokens, max(64, window // 32))
    measured = measured_requests(conversation_id=parent.conversation_id, model=parent.model)

    def make_room(history: list[dict[str, Any]], turn: list[dict[str, Any]], size: RequestSize) -> Room | None:
        factor = calibration_from([*measured, *size.measured]).factor(size.count)
        room = turn_room(turn, size, window=window, max_tokens=max_tokens, factor=factor, fit_share=FIT_SHARE,
                         target_share=settings.CC_COMPACT_TO_PERCENT / 100, min_output=min_output,
                         image_rule=transcript.provider_image_rule(parent.provider))  # fmt: skip
        if room is not None and room.results:
            asked = room.max_tokens or max_tokens
            event = {"trigger": "proactive", "rung": "elide", "results": len(room.results), "max_tokens": asked}
            emit("compaction", {**event, "tokens_before": size.estimated})
        return room

    return make_room


def context_view(*, conversation: Conversation) -> dict[str, Any]:
    """The Context view (TD-15, CH-10 /context): what the next request of this conversation holds.

    The one composition of the window: the page, `GET /api/conversations/<id>/context`
    and the `/context` command all call it. The request is built with the parts a run
    uses (`agents.lifecycle.run_execute`, through this module): the system prompt plus the deferred-name index
    as system blocks, the catalog surface (mode filter, then deferral) wrapped by the
    scratchpad's turn toolbox for the tool block, and the stored path after the runtime's
    pruning of stale tool output. The turn is the conversation's latest run, so its live
    scratchpad entries are the ones `scratchpad_read` would be offered for.
    """
    latest_run = Run.objects.filter(conversation=conversation).order_by("-id").first()
    turn_id = latest_run.pk if latest_run else 0
    # The very functions run_execute builds its requests with (TD-15).
    # The next run's model and mode are the conversation's pickers (run_start reads the same fields).
    catalog, toolbox = turn_toolboxes(
        run_id=turn_id,
        conversation_id=conversation.pk,
        owner_id=conversation.owner_id,
        mode=conversation.mode,
        take_pins=False,
    )
    path = selectors.current_path(conversation)
    pruning = turn_pruned(selectors.view_of_path(conversation_id=conversation.pk, path=path))
    # The tools earlier turns loaded go out again, as the loop restores them (engine/loop.py): the
    # view left them out, a thousand tokens short of what the next request sent (QA).
    if referenced := referenced_tools(pruning.messages):
        toolbox.restore_loaded(referenced, tools_by_recency(pruning.messages), called=called_tools(pruning.messages))
    request = ModelRequestSpec(
        model=conversation.model or settings.CC_MODEL,
        system=turn_system(catalog),
        tools=toolbox.schemas(),
        messages=pruning.messages,
    )
    # The tool-use system prompt and image rule of the provider the next run would use (run_start reads
    # CC_MODELS too).
    provider = settings.CC_MODELS.get(request.model, "")
    tool_prompt = tool_prompt_tokens(provider, request.model)
    images = transcript.provider_image_rule(provider)
    view = export.context_breakdown(
        request,
        window_tokens=settings.CC_CONTEXT_WINDOW_TOKENS,
        tool_index_text=catalog.surface.index_text,
        tool_prompt_tokens=tool_prompt,
        image_rule=images,
    )
    count = transcript.request_count(
        request.system, request.tools, request.messages, tool_prompt=tool_prompt, image_rule=images
    )
    calibrated = calibration(conversation_id=conversation.pk, model=request.model)
    entries = entries_visible_to_turn(turn_id=str(turn_id), conversation_id=conversation.pk).order_by("created_at")
    resident_names = {tool.name for tool in catalog.surface.resident}
    tools = surface_context(catalog.surface)
    return {
        "conversation": conversation.pk,
        "model": request.model,
        **view,
        # The same count calibrated by the conversation's last measured request: what the trigger uses (CH-12).
        "calibration": round(calibrated.factor(count), 4),
        "calibrated_tokens": calibrated.tokens(count),
        "tools": tools,
        "budget": window_budget(resident_tokens=tools["resident_tokens"], loaded_budget_tokens=catalog.loaded_budget),
        # Offered beyond the resident set in this request (scratchpad_read while entries are live).
        "extra_tools": [schema["name"] for schema in request.tools if schema["name"] not in resident_names],
        "pruned": {"results": pruning.results_pruned, "tokens_freed": pruning.tokens_freed},
        # Digests of rewound explorations, sent in front of the prompt that followed the rewind (CH-9).
        "rewind_notes": [
            {"message": message_id, "text": note, "tokens": estimate_text_tokens(note)}
            for message_id, notes in selectors.rewind_notes(conversation_id=conversation.pk, path=path).items()
            for note in notes
        ],
        "turn": {"run": latest_run.pk if latest_run else None, "status": latest_run.status if latest_run else None},
        "scratchpad": [
            {
                "id": entry.pk,
                "tool": entry.executor_name,
                "step": entry.step_num,
                "kind": entry.kind,
                "size_bytes": entry.size_bytes,
                "lines": entry.line_count,
                "pinned": entry.pinned,
                "summary": entry.summary,
                "expires_at": entry.expires_at.isoformat(),
            }
            for entry in entries
        ],
    }

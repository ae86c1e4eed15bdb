from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import chat, lifecycle, selectors, services, turns
from agents.models import Approval
from agents.serializers import ApprovalSerializer, CacheMetricSerializer, RunEventSerializer, RunSerializer
from controlcenter.api import MAX_QUERY_INT, query_int, request_user
from conversations import selectors as conversation_selectors
from conversations.selectors import conversation_for_user
from conversations.serializers import (
    CompactionSerializer,
    CompactSerializer,
    MessageCreateSerializer,
    MessageEditSerializer,
    MessageSerializer,
)
from conversations.services import conversation_compact
from scratchpad import services as scratchpad_services
from scratchpad.serializers import EntrySerializer

COMMAND_RESULT = inline_serializer(
    "CommandResult",
    {"command": serializers.CharField(), "detail": serializers.CharField(), "data": serializers.DictField()},
)


class RunDetailApi(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        return Response(RunSerializer(run).data)


class RunCancelApi(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        return Response(RunSerializer(services.run_cancel(run=run)).data)


class RunRetryApi(APIView):
    @extend_schema(request=None, responses={201: RunSerializer})
    def post(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        return Response(RunSerializer(services.run_retry(run=run)).data, status=status.HTTP_201_CREATED)


class RunEventsApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT},
                description="Return events with a sequence number above this.",
            )
        ],
        responses=RunEventSerializer(many=True),
    )
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        events = selectors.run_events_after(run=run, after=query_int(request.query_params, "after", 0))
        return Response(RunEventSerializer(events, many=True).data)


class RunApprovalsApi(APIView):
    @extend_schema(responses=ApprovalSerializer(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        return Response(ApprovalSerializer(selectors.approvals_of(run=run), many=True).data)


class ConversationApprovalsApi(APIView):
    """Where a person finds every call waiting in a conversation, a subagent's included."""

    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=list(Approval.Status.values), description="Default: all.")],
        responses=ApprovalSerializer(many=True),
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        wanted = request.query_params.get("status")
        if wanted is not None and wanted not in Approval.Status.values:
            raise ValidationError({"status": f"{wanted!r} is not one of {', '.join(Approval.Status.values)}."})
        approvals = selectors.approvals_of_conversation(conversation=conversation, status=wanted)
        return Response(ApprovalSerializer(approvals, many=True).data)


class ApprovalDecideApi(APIView):
    """POST /api/approvals/<id>/approve/ or /deny/: owner only (404 otherwise), 409 once decided."""

    decision = ""

    @extend_schema(request=None, responses=ApprovalSerializer)
    def post(self, request: Request, approval_id: int) -> Response:
        approval = lifecycle.approval_decide(
            approval_id=approval_id, user=request_user(request), decision=self.decision
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalApproveApi(ApprovalDecideApi):
    decision = Approval.Status.APPROVED


class ApprovalDenyApi(ApprovalDecideApi):
    decision = Approval.Status.DENIED


class CacheMetricsApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("group", str, enum=list(selectors.CACHE_GROUPS), description="Default: day."),
            OpenApiParameter(
                "run",
                {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT},
                description="Only this run's requests.",
            ),
        ],
        responses=CacheMetricSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        group = request.query_params.get("group", "day")
        if group not in selectors.CACHE_GROUPS:
            raise ValidationError({"group": f"{group!r} is not one of {', '.join(selectors.CACHE_GROUPS)}."})
        run_id = query_int(request.query_params, "run")
        rows = selectors.cache_metrics(user=request_user(request), group=group, run_id=run_id)
        return Response(CacheMetricSerializer(rows, many=True).data)


# --- a conversation's runs: sending starts one, retry starts another, Context shows the next -----


class MessageCreateApi(APIView):
    """The message tree (GET) and sending a message or a slash command (POST)."""

    @extend_schema(
        operation_id="conversations_message_tree",
        responses=inline_serializer(
            "MessageTree",
            {
                "conversation": serializers.IntegerField(),
                "tip": serializers.IntegerField(allow_null=True, help_text="null: no messages yet"),
                "roots": serializers.ListField(child=serializers.IntegerField()),
                "messages": inline_serializer(
                    "MessageTreeNode",
                    {
                        "id": serializers.IntegerField(),
                        "parent": serializers.IntegerField(allow_null=True),
                        "role": serializers.CharField(),
                        "preview": serializers.CharField(),
                        "children": serializers.ListField(child=serializers.IntegerField()),
                        "on_path": serializers.BooleanField(),
                    },
                    many=True,
                ),
            },
        ),
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        return Response(conversation_selectors.message_tree(conversation=conversation))

    @extend_schema(
        request=MessageCreateSerializer,
        responses={
            201: inline_serializer("MessageSent", {"message": MessageSerializer(), "run": RunSerializer()}),
            200: inline_serializer("CommandDone", {"command": COMMAND_RESULT}),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        payload = MessageCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        sent = chat.message_send(
            conversation=conversation,
            text=payload.validated_data["text"],
            after=payload.validated_data.get("after", chat.ANY_TIP),
        )
        if sent.command is not None:
            return Response({"command": sent.command.as_dict()})
        return Response(
            {
                "message": MessageSerializer(sent.message).data,
                "run": RunSerializer(sent.run).data,
                **({"note": sent.note} if sent.note else {}),
            },
            status=status.HTTP_201_CREATED,
        )


class MessageEditApi(APIView):
    """Edit a prompt and re-run it as a sibling; the old answer stays reachable (CH-7)."""

    @extend_schema(
        request=MessageEditSerializer,
        responses={201: inline_serializer("MessageEdited", {"message": MessageSerializer(), "run": RunSerializer()})},
    )
    def post(self, request: Request, conversation_id: int, message_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        payload = MessageEditSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        sent = chat.message_edit(conversation=conversation, message_id=message_id, text=payload.validated_data["text"])
        return Response(
            {"message": MessageSerializer(sent.message).data, "run": RunSerializer(sent.run).data},
            status=status.HTTP_201_CREATED,
        )


class MessageRegenerateApi(APIView):
    """Answer a reply's prompt again; the new reply is a sibling of the old one (UX-2)."""

    @extend_schema(
        request=None,
        responses={
            201: inline_serializer("MessageRegenerated", {"message": MessageSerializer(), "run": RunSerializer()})
        },
    )
    def post(self, request: Request, conversation_id: int, message_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        sent = chat.message_regenerate(conversation=conversation, message_id=message_id)
        return Response(
            {"message": MessageSerializer(sent.message).data, "run": RunSerializer(sent.run).data},
            status=status.HTTP_201_CREATED,
        )


class CompactApi(APIView):
    """Compaction passes (CH-10 /compact; `rungs: ["elide", "drop_images"]` is /shake). With the summary
    rung (CH-14) the pass calls the model, so a worker makes it: 202 with the queued compaction run."""

    @extend_schema(responses=CompactionSerializer(many=True))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        return Response(
            CompactionSerializer(conversation_selectors.compactions_for(conversation=conversation), many=True).data
        )

    @extend_schema(
        request=CompactSerializer,
        responses={201: CompactionSerializer, 200: OpenApiTypes.OBJECT, 202: inline_serializer(
            "CompactionQueued", {"run": RunSerializer(), "detail": serializers.CharField()})},
    )  # fmt: skip
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        payload = CompactSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        rungs = payload.validated_data["rungs"]
        if "summary" in rungs:
            run = services.compaction_start(conversation=conversation, rungs=rungs)
            detail = f"Compaction run {run.pk} is queued; a worker climbs {', '.join(rungs)} with {run.model}."
            return Response({"run": RunSerializer(run).data, "detail": detail}, status=status.HTTP_202_ACCEPTED)
        done = conversation_compact(conversation=conversation, rungs=rungs)
        if done.compaction is None:
            # Too little to free (CH-11): nothing recorded, the path sends what it sent before.
            return Response(
                {"recorded": False, "detail": done.reason, "tokens_now": done.tokens_now,
                 "tokens_after": done.result.tokens_after, "freed": max(0, done.freed), "required": done.required}
            )  # fmt: skip
        return Response(CompactionSerializer(done.compaction).data, status=status.HTTP_201_CREATED)


class ContextApi(APIView):
    @extend_schema(responses=inline_serializer("ContextView", {"used_tokens": serializers.IntegerField()}))
    def get(self, request: Request, conversation_id: int) -> Response:
        return Response(
            turns.context_view(
                conversation=conversation_for_user(user=request_user(request), conversation_id=conversation_id)
            )
        )


class RetryApi(APIView):
    @extend_schema(request=None, responses={201: RunSerializer})
    def post(self, request: Request, conversation_id: int) -> Response:
        run = chat.conversation_retry(
            conversation=conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


class RunEntriesApi(APIView):
    @extend_schema(responses=EntrySerializer(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request_user(request)), pk=run_id)
        entries = scratchpad_services.list_for_turn(turn_id=str(run.pk))
        return Response(EntrySerializer(entries, many=True).data)

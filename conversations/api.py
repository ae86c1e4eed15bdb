from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlcenter.api import request_user
from conversations import selectors, services
from conversations.serializers import (
    BranchSerializer,
    CheckpointCreateSerializer,
    CheckpointSerializer,
    ConversationCreateSerializer,
    ConversationListQuerySerializer,
    ConversationSerializer,
    ConversationUpdateSerializer,
    ForkSerializer,
    MessageSerializer,
    ModelChoiceSerializer,
    PathMessageSerializer,
    RewindDigestSerializer,
    RewindSerializer,
)


class ConversationListApi(APIView):
    @extend_schema(parameters=[ConversationListQuerySerializer], responses=ConversationSerializer(many=True))
    def get(self, request: Request) -> Response:
        query = ConversationListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = query.validated_data
        conversations = selectors.conversations_for_user(user=request_user(request), search=page["q"])
        return Response(
            ConversationSerializer(conversations[page["offset"] : page["offset"] + page["limit"]], many=True).data
        )

    @extend_schema(request=ConversationCreateSerializer, responses={201: ConversationSerializer})
    def post(self, request: Request) -> Response:
        payload = ConversationCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        conversation = services.conversation_create(owner=request_user(request), **payload.validated_data)
        return Response(ConversationSerializer(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "path",
                str,
                enum=["1", "0"],
                description="0: leave the path out (null), for a page that wants the title and pickers of a "
                "long conversation. Default: 1.",
            )
        ],
        responses=inline_serializer(
            "ConversationWithPath",
            {"conversation": ConversationSerializer(), "path": PathMessageSerializer(many=True, allow_null=True)},
        ),
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        with_path = request.query_params.get("path", "1")
        if with_path not in ("0", "1"):
            raise ValidationError({"path": f"{with_path!r} is not 0 or 1."})
        conversation = selectors.conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        path = selectors.current_path(conversation) if with_path == "1" else None
        return Response(
            {
                "conversation": ConversationSerializer(conversation).data,
                "path": None if path is None else PathMessageSerializer(path, many=True).data,
            }
        )

    @extend_schema(request=ConversationUpdateSerializer, responses=ConversationSerializer)
    def patch(self, request: Request, conversation_id: int) -> Response:
        """Pick the model and mode the next run uses, or rename the conversation."""
        conversation = selectors.conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        payload = ConversationUpdateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        changes = payload.validated_data
        if "mode" in changes:
            changes["mode_id"] = changes.pop("mode")
        return Response(ConversationSerializer(services.conversation_update(conversation=conversation, **changes)).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, conversation_id: int) -> Response:
        """Delete the conversation with its messages and runs; 409 while a run works in it."""
        conversation = selectors.conversation_for_user(user=request_user(request), conversation_id=conversation_id)
        services.conversation_delete(conversation=conversation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelListApi(APIView):
    """The models a conversation may pick (CC_MODELS), the server default first."""

    @extend_schema(responses=ModelChoiceSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ModelChoiceSerializer(selectors.models_offered(), many=True).data)


def _conversation(request: Request, conversation_id: int):
    return selectors.conversation_for_user(user=request_user(request), conversation_id=conversation_id)


class MessageDetailApi(APIView):
    @extend_schema(responses=MessageSerializer)
    def get(self, request: Request, conversation_id: int, message_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        message = selectors.message_in_conversation(conversation=conversation, message_id=message_id)
        return Response(MessageSerializer(message).data)


class BranchApi(APIView):
    @extend_schema(request=BranchSerializer, responses={200: ConversationSerializer})
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        payload = BranchSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        services.conversation_branch(conversation=conversation, message_id=payload.validated_data["message"])
        return Response(ConversationSerializer(conversation).data)


class ForkApi(APIView):
    @extend_schema(request=ForkSerializer, responses={201: ConversationSerializer})
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        payload = ForkSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        fork = services.conversation_fork(conversation=conversation, title=payload.validated_data["title"])
        return Response(ConversationSerializer(fork).data, status=status.HTTP_201_CREATED)


class CheckpointListApi(APIView):
    @extend_schema(responses=CheckpointSerializer(many=True))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        return Response(CheckpointSerializer(selectors.checkpoints_for(conversation=conversation), many=True).data)

    @extend_schema(request=CheckpointCreateSerializer, responses={201: CheckpointSerializer})
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        payload = CheckpointCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        checkpoint = services.checkpoint_create(conversation=conversation, label=payload.validated_data["label"])
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)


class RewindApi(APIView):
    @extend_schema(responses=RewindDigestSerializer(many=True))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        return Response(RewindDigestSerializer(selectors.rewinds_for(conversation=conversation), many=True).data)

    @extend_schema(request=RewindSerializer, responses={200: RewindDigestSerializer})
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        payload = RewindSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        record = services.conversation_rewind(conversation=conversation, label=payload.validated_data["label"])
        return Response(RewindDigestSerializer(record).data)


class ExportApi(APIView):
    """The current path as JSON (`json`) or Markdown (`markdown`)."""

    @extend_schema(
        parameters=[OpenApiParameter("kind", str, OpenApiParameter.PATH, enum=["json", "markdown"])],
        responses={(200, "application/json"): OpenApiTypes.OBJECT, (200, "text/markdown"): OpenApiTypes.STR},
    )
    def get(self, request: Request, conversation_id: int, kind: str) -> HttpResponse:
        exported = selectors.conversation_export(conversation=_conversation(request, conversation_id), kind=kind)
        if isinstance(exported, str):
            return HttpResponse(exported, content_type="text/markdown; charset=utf-8")
        return Response(exported)

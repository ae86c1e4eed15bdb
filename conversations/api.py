from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.serializers import RunSerializer
from controlcenter.api import error_schema
from conversations import selectors, services
from conversations.serializers import (
    ConversationCreateSerializer,
    ConversationSerializer,
    MessageCreateSerializer,
    MessageSerializer,
)


class ConversationListApi(APIView):
    @extend_schema(responses=ConversationSerializer(many=True))
    def get(self, request: Request) -> Response:
        conversations = selectors.conversations_for_user(user=request.user, search=request.query_params.get("q", ""))
        return Response(ConversationSerializer(conversations[:200], many=True).data)

    @extend_schema(request=ConversationCreateSerializer, responses={201: ConversationSerializer})
    def post(self, request: Request) -> Response:
        payload = ConversationCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        conversation = services.conversation_create(owner=request.user, **payload.validated_data)
        return Response(ConversationSerializer(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailApi(APIView):
    @extend_schema(
        responses=inline_serializer(
            "ConversationWithPath",
            {"conversation": ConversationSerializer(), "path": MessageSerializer(many=True)},
        )
    )
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
        return Response(
            {
                "conversation": ConversationSerializer(conversation).data,
                "path": MessageSerializer(selectors.current_path(conversation), many=True).data,
            }
        )


class MessageCreateApi(APIView):
    @extend_schema(
        request=MessageCreateSerializer,
        responses={
            201: inline_serializer("MessageSent", {"message": MessageSerializer(), "run": RunSerializer()}),
            400: error_schema(),
            404: error_schema(),
            409: error_schema(),
        },
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
        payload = MessageCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        message, run = services.message_send(conversation=conversation, text=payload.validated_data["text"])
        return Response(
            {"message": MessageSerializer(message).data, "run": RunSerializer(run).data},
            status=status.HTTP_201_CREATED,
        )

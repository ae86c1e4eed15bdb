from __future__ import annotations

from django.urls import path

from agents.consumers import ConversationEventsConsumer, DashboardConsumer, RunEventsConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunEventsConsumer.as_asgi()),
    path("ws/conversations/<int:conversation_id>/", ConversationEventsConsumer.as_asgi()),
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
]

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from agents import api as agents_api
from controlcenter.health import healthz
from conversations import api as conversations_api
from conversations import views as conversations_views

api_patterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/conversations/", conversations_api.ConversationListApi.as_view(), name="api-conversations"),
    path(
        "api/conversations/<int:conversation_id>/",
        conversations_api.ConversationDetailApi.as_view(),
        name="api-conversation",
    ),
    path(
        "api/conversations/<int:conversation_id>/messages/",
        conversations_api.MessageCreateApi.as_view(),
        name="api-conversation-messages",
    ),
    path("api/runs/<int:run_id>/", agents_api.RunDetailApi.as_view(), name="api-run"),
    path("api/runs/<int:run_id>/cancel/", agents_api.RunCancelApi.as_view(), name="api-run-cancel"),
    path("api/runs/<int:run_id>/events/", agents_api.RunEventsApi.as_view(), name="api-run-events"),
    # runtime: approvals and cache metrics (RN-4, RN-2)
    path("api/runs/<int:run_id>/approvals/", agents_api.RunApprovalsApi.as_view(), name="api-run-approvals"),
    path("api/approvals/<int:approval_id>/approve/", agents_api.ApprovalApproveApi.as_view(), name="api-approve"),
    path("api/approvals/<int:approval_id>/deny/", agents_api.ApprovalDenyApi.as_view(), name="api-deny"),
    path("api/metrics/cache/", agents_api.CacheMetricsApi.as_view(), name="api-metrics-cache"),
]

urlpatterns = [
    path("", conversations_views.conversation_list, name="conversation-list"),
    path("conversations/<int:conversation_id>/", conversations_views.conversation_detail, name="conversation-detail"),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    *api_patterns,
]

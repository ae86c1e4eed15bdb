from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from agents import api as agents_api
from agents import views as agents_views
from controlcenter.health import healthz
from controlcenter.views import favicon
from conversations import api as conversations_api
from conversations import views as conversations_views
from scratchpad import views as scratchpad_views
from toolcatalog import api as toolcatalog_api


class RowIdConverter:
    """A row id: at most 18 digits, so an id beyond PostgreSQL's bigint is a 404, not a database error."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(RowIdConverter, "id")

api_patterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its starter script as a file, not inline; its template has no inline style (SB-6).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
        name="api-docs",
    ),
    path("api/conversations/", conversations_api.ConversationListApi.as_view(), name="api-conversations"),
    path(
        "api/conversations/<id:conversation_id>/",
        conversations_api.ConversationDetailApi.as_view(),
        name="api-conversation",
    ),
    path(
        "api/conversations/<id:conversation_id>/messages/",
        agents_api.MessageCreateApi.as_view(),
        name="api-conversation-messages",
    ),
    # Conversation history (CH-5..CH-10)
    *[
        path(f"api/conversations/<id:conversation_id>/{route}", view.as_view(), name=name)
        for route, view, name in [
            ("messages/<id:message_id>/", conversations_api.MessageDetailApi, "api-message"),
            ("messages/<id:message_id>/edit/", agents_api.MessageEditApi, "api-message-edit"),
            ("messages/<id:message_id>/regenerate/", agents_api.MessageRegenerateApi, "api-message-regenerate"),
            ("branch/", conversations_api.BranchApi, "api-conversation-branch"),
            ("fork/", conversations_api.ForkApi, "api-conversation-fork"),
            ("checkpoints/", conversations_api.CheckpointListApi, "api-conversation-checkpoints"),
            ("rewind/", conversations_api.RewindApi, "api-conversation-rewind"),
            ("compact/", agents_api.CompactApi, "api-conversation-compact"),
            ("context/", agents_api.ContextApi, "api-conversation-context"),
            ("export/<str:kind>/", conversations_api.ExportApi, "api-conversation-export"),
            ("retry/", agents_api.RetryApi, "api-conversation-retry"),
        ]
    ],
    path("api/runs/<id:run_id>/", agents_api.RunDetailApi.as_view(), name="api-run"),
    path("api/runs/<id:run_id>/cancel/", agents_api.RunCancelApi.as_view(), name="api-run-cancel"),
    path("api/runs/<id:run_id>/retry/", agents_api.RunRetryApi.as_view(), name="api-run-retry"),
    path("api/runs/<id:run_id>/events/", agents_api.RunEventsApi.as_view(), name="api-run-events"),
    # The Context view without the trailing slash, as the catalog first published it (TD-15).
    # Kept out of the OpenAPI schema: it is the same operation as context/ (one operationId).
    path("api/conversations/<id:conversation_id>/context", agents_api.ContextApi.as_view(schema=None)),
    path("api/tools/", toolcatalog_api.ToolListApi.as_view(), name="api-tools"),
    path("api/modes/", toolcatalog_api.ModeListApi.as_view(), name="api-modes"),
    path("api/models/", conversations_api.ModelListApi.as_view(), name="api-models"),
    path("api/groups/", toolcatalog_api.ToolGroupListApi.as_view(), name="api-groups"),
    path("api/mcp-servers/", toolcatalog_api.McpServerListApi.as_view(), name="api-mcp-servers"),
    path(
        "api/mcp-servers/<id:server_id>/",
        toolcatalog_api.McpServerDetailApi.as_view(),
        name="api-mcp-server",
    ),
    path(
        "api/mcp-servers/<id:server_id>/refresh/",
        toolcatalog_api.McpServerRefreshApi.as_view(),
        name="api-mcp-server-refresh",
    ),
    # A run's entries are listed under the run's owner check, which lives with runs.
    path(
        "api/scratchpad/runs/<id:run_id>/entries/",
        agents_api.RunEntriesApi.as_view(),
        name="api-scratchpad-run-entries",
    ),
    path("api/scratchpad/", include("scratchpad.urls")),
    # runtime: approvals and cache metrics (RN-4, RN-2)
    path("api/runs/<id:run_id>/approvals/", agents_api.RunApprovalsApi.as_view(), name="api-run-approvals"),
    path(
        "api/conversations/<id:conversation_id>/approvals/",
        agents_api.ConversationApprovalsApi.as_view(),
        name="api-conversation-approvals",
    ),
    path("api/approvals/<id:approval_id>/approve/", agents_api.ApprovalApproveApi.as_view(), name="api-approve"),
    path("api/approvals/<id:approval_id>/deny/", agents_api.ApprovalDenyApi.as_view(), name="api-deny"),
    path("api/metrics/cache/", agents_api.CacheMetricsApi.as_view(), name="api-metrics-cache"),
]


urlpatterns = [
    path("", agents_views.conversation_list, name="conversation-list"),
    path("conversations/<id:conversation_id>/", agents_views.conversation_detail, name="conversation-detail"),
    path(
        "conversations/<id:conversation_id>/messages/",
        agents_views.conversation_messages,
        name="conversation-messages",
    ),
    path("conversations/<id:conversation_id>/usage/", agents_views.conversation_usage, name="conversation-usage"),
    path("conversations/<id:conversation_id>/tree/", conversations_views.conversation_tree, name="conversation-tree"),
    path(
        "conversations/<id:conversation_id>/tree/rows/",
        conversations_views.conversation_tree_rows,
        name="conversation-tree-rows",
    ),
    path(
        "conversations/<id:conversation_id>/context/",
        agents_views.conversation_context,
        name="conversation-context",
    ),
    path("scratchpad/<str:entry_id>/", scratchpad_views.entry_viewer, name="scratchpad-viewer"),
    path("runs/<id:run_id>/", agents_views.run_detail, name="run-detail"),
    path("dashboard/", agents_views.dashboard, name="dashboard"),
    path("dashboard/data/", agents_views.dashboard_data, name="dashboard-data"),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("admin/", admin.site.urls),
    *api_patterns,
]
handler404 = "controlcenter.views.not_found"
handler500 = "controlcenter.views.server_error"

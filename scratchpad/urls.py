from __future__ import annotations

from django.urls import path

from scratchpad import api

urlpatterns = [
    path("entries/<str:entry_id>/", api.EntryDetailApi.as_view(), name="api-scratchpad-entry"),
    path("entries/<str:entry_id>/read/", api.EntryReadApi.as_view(), name="api-scratchpad-entry-read"),
    path("entries/<str:entry_id>/pin/", api.EntryPinApi.as_view(), name="api-scratchpad-entry-pin"),
]

"""ASGI entry point: HTTP through Django, websockets through Channels."""

from __future__ import annotations

import asyncio
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
django_asgi_app = get_asgi_application()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from agents.events import register_server_loop  # noqa: E402
from agents.lifecycle import embedded_recover  # noqa: E402
from controlcenter.middleware import BodySizeLimit  # noqa: E402
from controlcenter.mode import log_mode  # noqa: E402
from controlcenter.routing import websocket_urlpatterns  # noqa: E402
from toolcatalog.mcp_server import mcp_endpoint  # noqa: E402

log_mode()

router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


async def _application(scope, receive, send):  # noqa: ANN001, ANN201
    # Remember the server's loop: an embedded worker thread sends events through it.
    register_server_loop(asyncio.get_running_loop())
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if settings.CC_MODE == "embedded":
                    await sync_to_async(embedded_recover)()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await mcp_endpoint.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http" and mcp_endpoint.handles(scope["path"]):
        # The MCP endpoint (Streamable HTTP) is the SDK's ASGI app, not a Django view.
        await mcp_endpoint(scope, receive, send)
        return
    await router(scope, receive, send)


# The body-size limit wraps everything, /mcp included, so no app reads an oversized body (SB-5).
application = BodySizeLimit(_application)

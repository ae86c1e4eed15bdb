"""Settings for Control Center, read from the environment (see README, "Configuration").

Two modes:
- services: DATABASE_URL and REDIS_URL set -> PostgreSQL, Redis broker and channel
  layer, runs executed by Celery workers;
- embedded: neither set -> SQLite under var/, in-memory channel layer, runs executed
  by a worker thread inside the web process, so a laptop needs nothing installed.
"""

from __future__ import annotations

import os
import re
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

from controlcenter.channel_redis import channel_layer_host
from controlcenter.env import (
    ImproperEnvironment,
    env_bool,
    env_choice,
    env_database_url,
    env_http_url,
    env_int,
    env_list,
    env_on_off,
    env_redis_url,
    env_secret,
    env_str,
)
from engine.window import budget_for_window

BASE_DIR = Path(__file__).resolve().parent.parent


def _assets(folder: str) -> Path:
    # A checkout has templates/ and static/ at its top; an installed wheel carries them as
    # package data (OP-6: BASE_DIR is then site-packages, where they are not).
    checkout = BASE_DIR / folder
    return checkout if checkout.is_dir() else Path(__file__).resolve().parent / "assets" / folder


# Mutable data: under the checkout, or, for an installed product, where it is started.
VAR_DIR = Path(
    env_str("CC_VAR_DIR", str(BASE_DIR / "var" if (BASE_DIR / "manage.py").is_file() else Path.cwd() / "var"))
)

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_secret("SECRET_KEY")
if SECRET_KEY is None:
    # Embedded use needs no configuration: keep a generated key under var/ so
    # sessions survive restarts without anyone choosing a secret.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        # Processes start side by side on a fresh install (web and worker, mypy's workers in CI):
        # one read the file another had created but not yet written, and Django refused the empty
        # key. The key is written aside and linked into place, so it appears whole, and only once.
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        _fresh = VAR_DIR / f".secret_key.{os.getpid()}"
        _fresh.write_text(secrets.token_urlsafe(50), encoding="utf-8")
        _fresh.chmod(0o600)
        try:
            os.link(_fresh, _key_file)
        except FileExistsError:
            pass  # another process's key won; this one uses it too
        finally:
            _fresh.unlink()
    SECRET_KEY = _key_file.read_text(encoding="utf-8").strip()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (production: `manage.py check --deploy` is clean with CC_HTTPS=on) ------------
# Off by default so a laptop serves plain HTTP on 127.0.0.1. On: cookies are HTTPS-only,
# plain HTTP is redirected and browsers are told (HSTS) to use HTTPS from then on.
CC_HTTPS = env_bool("CC_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = CC_HTTPS
# The health check is asked over plain HTTP from inside the container; it must not be redirected.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# SB-6: no sniffing, no referrer beyond this origin, never framed (X-Frame-Options and
# frame-ancestors), and a CSP with nothing inline and nothing from another origin.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CC_CONTENT_SECURITY_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    # Swagger UI draws its icons as data: URIs.
    "img-src": "'self' data:",
    "font-src": "'self'",
    # 'self' covers the page's own websocket (ws:/wss: on this host) in CSP Level 3.
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
SECURE_HSTS_SECONDS = env_int("CC_HSTS_SECONDS", 31_536_000 if CC_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("CC_HSTS_INCLUDE_SUBDOMAINS", CC_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("CC_HSTS_PRELOAD", CC_HTTPS)
# Behind a proxy that ends TLS, the request reaching us is plain HTTP: trust the proxy's
# X-Forwarded-Proto (only when it sets it and strips a client's), or the redirect would loop.
if env_bool("CC_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

_database = env_database_url("DATABASE_URL")
REDIS_URL = env_redis_url("REDIS_URL")
if (_database is None) != (REDIS_URL is None):
    raise ImproperEnvironment(
        "Set both DATABASE_URL and REDIS_URL (services mode) or neither (embedded mode); "
        f"only {'DATABASE_URL' if _database else 'REDIS_URL'} is set."
    )
CC_MODE = "embedded" if _database is None else "services"

if _database is None:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "controlcenter.sqlite3",
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
else:
    DATABASES = {"default": _database.as_django()}
    # Reliability: under ASGI every request runs in a thread of its own, so persistent
    # connections pile up (one per request thread) until PostgreSQL refuses new clients
    # ("too many clients": found by bench/load.py with 20 API clients). The web server
    # (`controlcenter serve`) therefore borrows from a bounded pool; a burst waits for a
    # connection instead of failing. Workers keep one persistent connection per thread.
    CC_DB_POOL_MAX = env_int("CC_DB_POOL_MAX", 0, minimum=0)
    if CC_DB_POOL_MAX and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # CONN_HEALTH_CHECKS (kept on) makes the pool check a connection before lending it.
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": CC_DB_POOL_MAX,
            "timeout": 60,
        }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- model provider -------------------------------------------------------------
PROVIDERS = ("offline", "anthropic", "openai", "local")
CC_PROVIDER = env_choice("CC_PROVIDER", list(PROVIDERS), "offline")
CC_MODEL = env_str(
    "CC_MODEL",
    {
        "offline": "offline-1",
        "anthropic": "claude-sonnet-4-5",
        "openai": "gpt-4o-mini",
        "local": "smollm2-135m-instruct",
    }[CC_PROVIDER],
)
ANTHROPIC_API_KEY = env_secret("ANTHROPIC_API_KEY")
ANTHROPIC_BASE_URL = env_http_url("ANTHROPIC_BASE_URL")
OPENAI_API_KEY = env_secret("OPENAI_API_KEY")
OPENAI_BASE_URL = env_http_url("OPENAI_BASE_URL")
# LM-1: "local" is a llama.cpp server that `serve`/`worker` keep running on this port (controlcenter/localmodel.py),
# or the one `controlcenter local-model` runs on another host (CC_LOCAL_MODEL_URL, then none is started here).
CC_LOCAL_MODEL_PORT = env_int("CC_LOCAL_MODEL_PORT", 8081, minimum=1, maximum=65535)
CC_LOCAL_MODEL_CONTEXT = env_int("CC_LOCAL_MODEL_CONTEXT", 8192, minimum=512)
CC_LOCAL_MODEL_URL = env_http_url("CC_LOCAL_MODEL_URL") or f"http://127.0.0.1:{CC_LOCAL_MODEL_PORT}/v1"
# The models a conversation may pick (its model picker), each served by a provider:
# "NAME" uses CC_PROVIDER, "NAME=PROVIDER" names another ("offline-1=offline,claude-sonnet-4-5=anthropic").
# CC_MODEL is the server default and always offered, first.
CC_MODELS: dict[str, str] = {CC_MODEL: CC_PROVIDER}
for _item in env_list("CC_MODELS", []):
    _name, _, _provider = (part.strip() for part in _item.partition("="))
    _provider = _provider or CC_PROVIDER
    if not _name or _provider not in PROVIDERS:
        raise ImproperEnvironment(
            f"CC_MODELS has {_item!r}; write NAME or NAME=PROVIDER with PROVIDER offline, anthropic, openai or local."
        )
    if CC_MODELS.setdefault(_name, _provider) != _provider:
        raise ImproperEnvironment(f"CC_MODELS names {_name!r} with two providers; a model has one.")
# Money on run cards and the conversation header (UX-6): "NAME=INPUT/OUTPUT" in USD per million
# tokens, e.g. "claude-sonnet-4-5=3/15,my-model=0.5/1.5"; models not named use the public
# Anthropic prices (agents.costs.DEFAULT_PRICES), others show no money.
CC_MODEL_PRICES: dict[str, tuple[float, float]] = {}
for _item in env_list("CC_MODEL_PRICES", []):
    _name, _, _price = (part.strip() for part in _item.partition("="))
    try:
        _input, _output = (float(part) for part in _price.split("/"))
    except ValueError:
        _input = _output = -1.0
    if not _name or not (0 <= _input < 1e6 and 0 <= _output < 1e6):
        raise ImproperEnvironment(
            f"CC_MODEL_PRICES has {_item!r}; write NAME=INPUT/OUTPUT in USD per million tokens, e.g. my-model=3/15."
        )
    CC_MODEL_PRICES[_name] = (_input, _output)
if "anthropic" in CC_MODELS.values() and not ANTHROPIC_API_KEY:
    raise ImproperEnvironment(
        "Provider anthropic (CC_PROVIDER or CC_MODELS) needs ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY_FILE)."
    )
if "openai" in CC_MODELS.values() and not (OPENAI_API_KEY or OPENAI_BASE_URL):
    raise ImproperEnvironment(
        "Provider openai (CC_PROVIDER or CC_MODELS) needs OPENAI_API_KEY, "
        "or OPENAI_BASE_URL for a local server (Ollama, vLLM, llama.cpp)."
    )

# The worker/server CLI flag --tool-deferral overrides this by setting the variable.
CC_SERVER_TOOL_DEFERRAL = env_on_off("CC_SERVER_TOOL_DEFERRAL", True)
# A prompt larger than the window is fine: the scratchpad takes what the tail cannot keep (CH-13).
CC_MAX_MESSAGE_CHARS = env_int("CC_MAX_MESSAGE_CHARS", 400_000, minimum=1)
CC_WORKSPACE_ROOT = Path(env_str("CC_WORKSPACE_ROOT", str(VAR_DIR / "workspaces")))
# Workers refresh a liveness key this often; a run whose worker misses three beats failed.
CC_WORKER_HEARTBEAT_SECONDS = env_int("CC_WORKER_HEARTBEAT_SECONDS", 5, minimum=1)
# Conversation history (CH-1..CH-10): the model's window; a local model's is the one its server
# was started with (LM-2).
CC_CONTEXT_WINDOW_TOKENS = env_int(
    "CC_CONTEXT_WINDOW_TOKENS", CC_LOCAL_MODEL_CONTEXT if CC_PROVIDER == "local" else 200_000, minimum=1024
)
# LM-2: every default below is capped at its share of the window (engine/window.py): a 200K
# window keeps these figures, an 8K one scales them all down; a variable set here still wins.
CC_WINDOW_BUDGET = budget_for_window(CC_CONTEXT_WINDOW_TOKENS)
# The resident tool block takes at most this share of the window; the least used tools are deferred.
CC_TOOL_WINDOW_PERCENT = env_int("CC_TOOL_WINDOW_PERCENT", 25, minimum=1)
CC_MAX_OUTPUT_TOKENS = env_int("CC_MAX_OUTPUT_TOKENS", CC_WINDOW_BUDGET.max_output_tokens, minimum=1)
# Work queued longer than this whose broker message is gone (a Redis flush or restart, an
# enqueue that failed after commit) is queued again by the workers' sweep (OP-2); /healthz
# reports queued work older than this as degraded.
CC_QUEUE_SWEEP_SECONDS = env_int("CC_QUEUE_SWEEP_SECONDS", 30, minimum=1)
# TD-12: prune tool output of turns older than the last KEEP_TURNS only when at least
# MIN_TOKENS would be freed at once, so pruning is a rare rewrite, not a steady cache miss.
CC_PRUNE_KEEP_TURNS = env_int("CC_PRUNE_KEEP_TURNS", 3, minimum=1)
CC_PRUNE_MIN_TOKENS = env_int("CC_PRUNE_MIN_TOKENS", CC_WINDOW_BUDGET.prune_min_tokens, minimum=1)
SCRATCHPAD_THRESHOLD_BYTES = env_int(
    "SCRATCHPAD_THRESHOLD_BYTES", CC_WINDOW_BUDGET.scratchpad_threshold_bytes, minimum=1
)
SCRATCHPAD_SUMMARY_CHARS = env_int("SCRATCHPAD_SUMMARY_CHARS", CC_WINDOW_BUDGET.summary_chars, minimum=16)
# Scratchpad content one user may keep (her entries' bytes before compression); an observation that would pass it
# is not stored, and the model gets its summary with a note (scratchpad/services.py, put_observation).
CC_SCRATCHPAD_QUOTA_MB = env_int("CC_SCRATCHPAD_QUOTA_MB", 1024, minimum=1)
# CH-2: compact proactively when a request would pass AT percent of the window, down to TO percent.
# A trigger at 100 % or more never fires before the provider refuses the request.
CC_COMPACT_AT_PERCENT = env_int("CC_COMPACT_AT_PERCENT", CC_WINDOW_BUDGET.compact_at_percent, minimum=1, maximum=99)
# Unset, the target keeps its default's proportion to the trigger, so setting the trigger alone
# (say 40, under the default target of 50) is enough.
CC_COMPACT_TO_PERCENT = env_int(
    "CC_COMPACT_TO_PERCENT",
    max(1, CC_COMPACT_AT_PERCENT * CC_WINDOW_BUDGET.compact_to_percent // CC_WINDOW_BUDGET.compact_at_percent),
    minimum=1,
)
if CC_COMPACT_TO_PERCENT >= CC_COMPACT_AT_PERCENT:
    # A target at or above the trigger leaves the history past the trigger, to be compacted again next turn.
    raise ImproperEnvironment(
        f"CC_COMPACT_TO_PERCENT={CC_COMPACT_TO_PERCENT} must be below CC_COMPACT_AT_PERCENT={CC_COMPACT_AT_PERCENT}."
    )
CC_COMPACT_TAIL_TOKENS = env_int("CC_COMPACT_TAIL_TOKENS", CC_WINDOW_BUDGET.compact_tail_tokens, minimum=256)
# The side of a snapshot page in pixels (CH-3): one page costs at most 5 % of the window.
CC_SNAPSHOT_PAGE_PIXELS = env_int("CC_SNAPSHOT_PAGE_PIXELS", CC_WINDOW_BUDGET.page_pixels, minimum=256)
# CH-11: a pass that frees fewer tokens than this (or than one snapshot page costs) is not
# recorded: it would rewrite the cached prefix for nothing.
CC_COMPACT_MIN_FREED_TOKENS = env_int("CC_COMPACT_MIN_FREED_TOKENS", 500, minimum=1)

# --- apps -----------------------------------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    # Swagger UI served by the app itself: /api/docs/ works offline and under a strict CSP (SB-6).
    "drf_spectacular_sidecar",
    # SB-5: failed logins and API-token attempts lock out a user and IP pair.
    "axes",
    "channels",
    "controlcenter",
    "conversations",
    "agents",
    "scratchpad",
    "toolcatalog",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlcenter.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlcenter.nostore.NoStoreMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it turns a lockout into the answer (controlcenter.lockout).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "controlcenter.urls"
ASGI_APPLICATION = "controlcenter.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [_assets("templates")],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# SB-5: Django's standard validators, so `password` and `12345678` are refused wherever a
# password is set (admin forms, `changepassword`).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# SB-5: after CC_LOGIN_FAILURE_LIMIT failed attempts one username from one IP address is locked
# out for CC_LOGIN_LOCKOUT_MINUTES, even with the right password; a success resets the count.
# The login form, the admin login and API tokens (REST and /mcp) count (controlcenter.lockout).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("CC_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("CC_LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlcenter.lockout.lockout_response"
# The client address is REMOTE_ADDR; behind a reverse proxy, run uvicorn with --proxy-headers.
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "conversation-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [_assets("static")]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve straight from the finders so `serve` works without a collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# SB-5: the largest request body, enforced before it is read (controlcenter.middleware.BodySizeLimit
# in the ASGI app); Django applies the same figure to bodies it reads itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("CC_MAX_REQUEST_BYTES", 2 * 1024 * 1024, minimum=1024)

# SB-5: how deep a JSON request body may nest (controlcenter.parsers).
CC_MAX_JSON_DEPTH = env_int("CC_MAX_JSON_DEPTH", 32, minimum=4)

REST_FRAMEWORK = {
    # JSON only: no endpoint takes a file, and DRF's form parsers turned a garbage multipart body
    # into an empty form, so a POST created an object from defaults (201) instead of a 400/415.
    "DEFAULT_PARSER_CLASSES": ["controlcenter.parsers.BoundedJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlcenter.lockout.ThrottledTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlcenter.api.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Control Center API",
    "DESCRIPTION": "Conversations, runs, tools and metrics of a Control Center installation.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Runs, subagents and approvals each have a `status`; name their enums instead of hashing them.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "agents.models.Run.Status",
        "ApprovalStatusEnum": "agents.models.Approval.Status",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlcenter.api.document_error_responses",
        "controlcenter.api.document_no_nul_strings",
    ],
}

# --- channels and celery --------------------------------------------------------
if REDIS_URL:
    CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS = 30
    # capacity: channels_redis silently drops the oldest buffered message of a consumer that is
    # more than `capacity` behind (default 100); a long run streams far more events than that to
    # a slow viewer, who would lose them until a reconnect. 1000 leaves room for seconds of lag.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # max_connections: redis-py's asyncio pool holds 100 and then fails at once
            # ("Too many connections"): 200 websockets opening together made 30 of them fail
            # with 500 in the load bench. A burst now opens more connections for a moment.
            # socket_timeout (OP-1): every consumer waits for its next message with a server-side
            # BZPOPMIN of 5 s (channels_redis's brpop_timeout). redis-py 8 gives every connection
            # a 5 s socket timeout by default (it had none up to 7), so an idle wait hit the client
            # timeout just before Redis answered: TimeoutError, and the websocket closed (1006)
            # about every 5 s. The read must outlast the blocking command; 30 s still notices a
            # dead Redis.
            # The connections re-raise a cancellation that Python 3.11's wait_for drops in redis-py's
            # writes: a closed websocket's consumer then ends (controlcenter/channel_redis.py).
            "CONFIG": {
                "hosts": [
                    channel_layer_host(
                        REDIS_URL,
                        max_connections=1000,
                        socket_timeout=CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS,
                        socket_connect_timeout=5,
                    )
                ],
                "capacity": 1000,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    # Reliability: a Redis restart must not take the worker down (see controlcenter/broker.py).
    CELERY_BROKER_TRANSPORT = "controlcenter.broker:Transport"
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"

# Threads, not Celery's default prefork: a turn mostly waits (the model's stream, a tool's program),
# and in one process the heartbeat, the cancel watcher and the runs share the worker's fate: a
# worker killed with SIGKILL takes its runs and, through the sandbox's --die-with-parent, their
# commands with it (OP-2, OP-4). Every fault test runs this pool, through `controlcenter worker`.
CELERY_WORKER_POOL = "threads"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", ["DEBUG", "INFO", "WARNING", "ERROR"], "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# --- built-in tools (RN-5) ---------------------------------------------------------
# Bytes of stdout and of stderr kept per bash call; the rest is counted, not kept.
CC_BASH_OUTPUT_CAP_BYTES = env_int("CC_BASH_OUTPUT_CAP_BYTES", 1_000_000, minimum=1024)
CC_BASH_MAX_TIMEOUT_SECONDS = env_int("CC_BASH_MAX_TIMEOUT_SECONDS", 1800, minimum=1)
# --- the tool sandbox (SB-1..3, docs/security.md): per-call limits of every program a tool runs.
CC_SANDBOX_NETWORK = env_choice("CC_SANDBOX_NETWORK", ["off", "on"], "off")
CC_SANDBOX_CPU_SECONDS = env_int("CC_SANDBOX_CPU_SECONDS", 600, minimum=1)
CC_SANDBOX_MEMORY_MB = env_int("CC_SANDBOX_MEMORY_MB", 2048, minimum=64)
CC_SANDBOX_PROCESSES = env_int("CC_SANDBOX_PROCESSES", 256, minimum=8)
CC_SANDBOX_FILE_SIZE_MB = env_int("CC_SANDBOX_FILE_SIZE_MB", 512, minimum=1)
CC_SANDBOX_TMP_MB = env_int("CC_SANDBOX_TMP_MB", 64, minimum=1)
# Per-call cgroups (CPU, memory and process limits over the whole call, and its kill): "auto" uses
# a writable cgroup below the worker's own (v2 first, else v1), "off" per-process rlimits only.
CC_SANDBOX_CGROUP = env_choice("CC_SANDBOX_CGROUP", ["auto", "off"], "auto")
# The host uid a root worker drops to before starting bubblewrap (a non-root worker runs it as itself).
CC_SANDBOX_UID = env_int("CC_SANDBOX_UID", 65534, minimum=1)
# Time budget of one call's regular-expression matching (search_files; SB-4).
CC_REGEX_TIMEOUT_SECONDS = env_int("CC_REGEX_TIMEOUT_SECONDS", 1, minimum=1)
# Disk quota of one user over all their workspaces; a write past it fails and is undone.
CC_WORKSPACE_QUOTA_MB = env_int("CC_WORKSPACE_QUOTA_MB", 1024, minimum=1)
CC_FETCH_MAX_BYTES = env_int("CC_FETCH_MAX_BYTES", 2_000_000, minimum=1024)
# CIDRs fetch_url may reach although they are loopback/private/link-local (e.g. "10.1.0.0/16").
CC_FETCH_ALLOWED_NETWORKS = env_list("CC_FETCH_ALLOWED_NETWORKS", [])
# Tools that run without a person's approval although they require it (e.g. "bash"); empty by default.
CC_TOOL_AUTO_APPROVE = env_list("CC_TOOL_AUTO_APPROVE", [])
# --- MCP endpoint (TD-9): an MCP session's action-limit counts end after this much idleness.
CC_MCP_SESSION_IDLE_SECONDS = env_int("CC_MCP_SESSION_IDLE_SECONDS", 1800, minimum=1)
# --- MCP client (MC-2): a call of an imported tool fails as a tool error after this long; a stdio
# server unused for CC_MCP_IDLE_SECONDS is stopped (started again on the next call).
CC_MCP_CALL_TIMEOUT_SECONDS = env_int("CC_MCP_CALL_TIMEOUT_SECONDS", 60, minimum=1)
CC_MCP_IMPORT_TIMEOUT_SECONDS = env_int("CC_MCP_IMPORT_TIMEOUT_SECONDS", 30, minimum=1)
CC_MCP_START_TIMEOUT_SECONDS = env_int("CC_MCP_START_TIMEOUT_SECONDS", 30, minimum=1)
CC_MCP_IDLE_SECONDS = env_int("CC_MCP_IDLE_SECONDS", 600, minimum=1)
# --- tool search (TD-6): bm25, or hybrid = BM25 + sentence embeddings (the model ships in engine/catalog/models).
CC_TOOL_SEARCH_RANKER = env_choice("CC_TOOL_SEARCH_RANKER", ["bm25", "hybrid"], "bm25")
CC_TOOL_EMBEDDINGS_DIR = Path(env_str("CC_TOOL_EMBEDDINGS_DIR", str(VAR_DIR / "tool-embeddings")))
_MODEL_FILE = BASE_DIR / "engine" / "catalog" / "models" / "all-MiniLM-L6-v2.int8.npz"
if CC_TOOL_SEARCH_RANKER == "hybrid" and not _MODEL_FILE.exists():
    raise ImproperEnvironment(
        f"CC_TOOL_SEARCH_RANKER=hybrid needs the model file {_MODEL_FILE}, which ships with the source: "
        "reinstall from a full checkout (and pip install '.[semantic]' for its thread control)."
    )
for _network in CC_FETCH_ALLOWED_NETWORKS:
    try:
        __import__("ipaddress").ip_network(_network, strict=False)
    except ValueError as _exc:
        raise ImproperEnvironment(
            f"CC_FETCH_ALLOWED_NETWORKS has {_network!r}, which is not a network: {_exc}"
        ) from None

# --- agent runtime (RN-4, TD-14) ------------------------------------------------------
# Tool calls one run may make in all, and per tool ("bash=20,fetch_url=50"); past a limit
# the call is an error observation that says so.
CC_RUN_MAX_ACTIONS = env_int("CC_RUN_MAX_ACTIONS", 200, minimum=1)
CC_TOOL_ACTION_LIMITS: dict[str, int] = {}
for _item in env_list("CC_TOOL_ACTION_LIMITS", []):
    _name, _, _limit = _item.partition("=")
    if not _name.strip() or not re.fullmatch(r"[0-9]{1,9}", _limit.strip()) or int(_limit) < 1:
        raise ImproperEnvironment(f"CC_TOOL_ACTION_LIMITS has {_item!r}; write NAME=N with N at least 1.")
    CC_TOOL_ACTION_LIMITS[_name.strip()] = int(_limit)
# Tool calls of one step run concurrently on at most this many threads.
CC_MAX_PARALLEL_TOOLS = env_int("CC_MAX_PARALLEL_TOOLS", 8, minimum=1)
# How long a fan-out's siblings wait for the first child to start streaming (TD-14).
CC_SUBAGENT_RELEASE_WAIT_SECONDS = env_int("CC_SUBAGENT_RELEASE_WAIT_SECONDS", 10, minimum=0)
# The Celery queue runs and subagents go to (a worker consumes it with -Q); lets pools be separated.
CC_RUN_QUEUE = env_str("CC_RUN_QUEUE", "celery")
# How long the parent waits for a fan-out's answers (a child waiting for approval included).
CC_SUBAGENT_TIMEOUT_SECONDS = env_int("CC_SUBAGENT_TIMEOUT_SECONDS", 600, minimum=1)
# Children one spawn_agents call may start.
CC_SUBAGENT_MAX_CHILDREN = env_int("CC_SUBAGENT_MAX_CHILDREN", 16, minimum=1)
# Subagent profiles (TD-14): a child's role and its limits. A profile never changes the
# tools or the system prompt (those come from the shape, so siblings share one cached
# prefix); its instructions go into the child's first user message, before the task.
CC_SUBAGENT_PROFILES: dict[str, dict[str, str | int]] = {
    "worker": {
        "instructions": "Do the task with the tools you have and report what you did and found.",
        "max_steps": 10,
        "max_actions": 40,
    },
    "researcher": {
        "instructions": (
            "You are a researcher. Read, list, search and fetch; do not change files or run commands that "
            "change anything. Report findings with the paths or URLs they come from."
        ),
        "max_steps": 15,
        "max_actions": 60,
    },
    "coder": {
        "instructions": (
            "You are a coder. Make the change in the workspace, run it to check it works, and report the "
            "files you changed and how you checked them."
        ),
        "max_steps": 20,
        "max_actions": 80,
    },
    "reviewer": {
        "instructions": (
            "You are a reviewer. Read the work named in the task, do not change it, and report concrete "
            "problems with where they are, most serious first."
        ),
        "max_steps": 10,
        "max_actions": 40,
    },
}

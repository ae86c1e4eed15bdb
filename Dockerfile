FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CC_VAR_DIR=/var/lib/controlcenter
WORKDIR /app
# The tool sandbox (SB-1, docs/security.md): every program a tool runs goes through bubblewrap;
# slirp4netns only serves CC_SANDBOX_NETWORK=on.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap slirp4netns \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY controlcenter ./controlcenter
COPY engine ./engine
COPY agents ./agents
COPY conversations ./conversations
COPY scratchpad ./scratchpad
COPY toolcatalog ./toolcatalog
COPY bench ./bench
COPY templates ./templates
COPY static ./static
COPY manage.py ./
RUN pip install --no-cache-dir . \
    && useradd --create-home controlcenter \
    && mkdir -p /var/lib/controlcenter \
    && chown controlcenter /var/lib/controlcenter
USER controlcenter
EXPOSE 8000
CMD ["controlcenter", "serve", "--host", "0.0.0.0", "--port", "8000"]

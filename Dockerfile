# Two stages (OP-5, OP-6): the wheel is built from the checkout, then installed with the locked
# dependencies (hashes checked) into a clean image; the image holds no source tree.
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir 'uv==0.13.9'
COPY pyproject.toml uv.lock README.md MANIFEST.in build_assets.py ./
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
RUN uv build --wheel -o /dist . \
    && uv export --frozen --no-emit-project --format requirements-txt -o /dist/requirements.lock

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CC_VAR_DIR=/var/lib/controlcenter
WORKDIR /app
# The tool sandbox (SB-1, docs/security.md): every program a tool runs goes through bubblewrap;
# slirp4netns only serves CC_SANDBOX_NETWORK=on.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap slirp4netns \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /dist /dist
RUN pip install --no-cache-dir --require-hashes -r /dist/requirements.lock \
    && pip install --no-cache-dir --no-deps /dist/controlcenter-*.whl \
    && rm -rf /dist \
    && useradd --create-home controlcenter \
    && mkdir -p /var/lib/controlcenter \
    && chown controlcenter /var/lib/controlcenter
USER controlcenter
EXPOSE 8000
CMD ["controlcenter", "serve", "--host", "0.0.0.0", "--port", "8000"]

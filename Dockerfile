FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CC_VAR_DIR=/var/lib/controlcenter
WORKDIR /app
# The locked dependencies first (a layer that changes only with uv.lock), with their hashes
# checked; then the product itself, without re-resolving anything (OP-5).
COPY pyproject.toml uv.lock README.md ./
RUN pip install --no-cache-dir 'uv==0.13.9' \
    && uv export --frozen --no-dev --no-emit-project --format requirements-txt -o /tmp/requirements.lock \
    && pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock
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
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home controlcenter \
    && mkdir -p /var/lib/controlcenter \
    && chown controlcenter /var/lib/controlcenter
USER controlcenter
EXPOSE 8000
CMD ["controlcenter", "serve", "--host", "0.0.0.0", "--port", "8000"]

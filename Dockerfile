# syntax=docker/dockerfile:1
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /srv

RUN groupadd --system --gid 10001 evermirror \
 && useradd --system --uid 10001 --gid 10001 --home-dir /srv evermirror

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-cache-dir . && mkdir -p /srv/data && chown 10001:10001 /srv/data

USER 10001
EXPOSE 8000
VOLUME ["/srv/data"]

# Binding 0.0.0.0 inside a container needs API keys (or --insecure for a private network).
ENV HOST=0.0.0.0 PORT=8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["python", "-m", "app"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# evermirror: `docker build -t evermirror .`, then
#   docker run -p 8000:8000 -v evermirror-data:/data evermirror
# A fresh container creates the first API key and prints it in its first log lines
# (`serve --first-key`); see "Container" in docs/deployment.md.

# ---- builder: the wheel, from the source tree --------------------------------------------
FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY app ./app
COPY migrations ./migrations
# app/web/client links to the JavaScript client's sources: the wheel holds those files.
COPY clients/js/src ./clients/js/src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- runtime: the installed package only, as a user without privileges ------------------
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 evermirror \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/evermirror evermirror

COPY --from=builder /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && mkdir -p /data \
 && chown 10001:10001 /data

USER 10001
WORKDIR /home/evermirror
VOLUME ["/data"]
EXPOSE 8000

# The service's settings (every one is in .env.example). Binding 0.0.0.0 needs API keys
# (or --insecure, for a private network): CMD's --first-key creates the first key when
# none exists and prints it, once. Logs are JSON lines (no terminal).
ENV DATABASE_URL=sqlite+aiosqlite:////data/evermirror.db \
    HOST=0.0.0.0 \
    PORT=8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["evermirror", "probe", "ready"]
ENTRYPOINT ["evermirror"]
# `docker stop` sends SIGTERM (the default STOPSIGNAL): the server drains for up to
# DRAIN_SECONDS (20) first; give it `docker stop -t 30` (compose: stop_grace_period).
CMD ["serve", "--first-key"]

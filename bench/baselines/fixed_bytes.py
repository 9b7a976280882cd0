"""FastAPI returning fixed bytes: the service's own newest page, fetched from it first,
on the same route template. The ceiling of what a FastAPI route can do with the page."""

from pathlib import Path

from fastapi import FastAPI, Response

from bench.baselines import arguments, serve


def create_app(body: bytes, etag: str) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/sessions/{session_id}/messages")
    async def messages(session_id: str) -> Response:
        return Response(body, media_type="application/json", headers={"ETag": etag})

    return app


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--etag", default='W/"0"')
    args = parser.parse_args()
    serve(create_app(args.body.read_bytes(), args.etag), args.port)


if __name__ == "__main__":
    main()

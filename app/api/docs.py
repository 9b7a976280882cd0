"""`/docs` (Swagger UI) and `/redoc` from assets the package ships (app/static), so the
documentation renders without internet: FastAPI's defaults load both from a CDN (and
ReDoc's fonts from Google), and a service on a closed network showed a blank page."""

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent.parent / "static"
STATIC_URL = "/static"
SWAGGER_JS = f"{STATIC_URL}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{STATIC_URL}/swagger-ui/swagger-ui.css"
REDOC_JS = f"{STATIC_URL}/redoc/redoc.standalone.js"
FAVICON = f"{STATIC_URL}/swagger-ui/favicon-32x32.png"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
# The pages may load nothing from another origin: ReDoc's bundle shows a logo from
# cdn.redoc.ly, which this keeps the browser from even requesting. Both pages have
# inline code and styles (FastAPI's page templates, styled-components), ReDoc a search
# worker from a blob: URL, and both draw icons from data: URLs.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'self'"
)


def install_docs(app: FastAPI, *, openapi_url: str = "/openapi.json") -> None:
    """Serve app/static and the two documentation pages. The app must be created with
    `docs_url=None, redoc_url=None` so FastAPI does not add its CDN pages."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name="static")

    def prefix(request: Request) -> str:
        # Behind a proxy that mounts the service under a path, as FastAPI's pages do.
        root: str = request.scope.get("root_path", "")
        return root.rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = prefix(request)
        return _confined(
            get_swagger_ui_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - Swagger UI",
                swagger_js_url=root + SWAGGER_JS,
                swagger_css_url=root + SWAGGER_CSS,
                swagger_favicon_url=root + FAVICON,
                oauth2_redirect_url=root + OAUTH2_REDIRECT,
            )
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = prefix(request)
        return _confined(
            get_redoc_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=root + REDOC_JS,
                redoc_favicon_url=root + FAVICON,
                with_google_fonts=False,
            )
        )


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    return page

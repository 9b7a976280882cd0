"""`/docs` and `/redoc` work offline: their pages reference only assets the service
serves itself, those assets answer with the right content type, and the wheel ships
them. (That the pages render in a browser with no network beyond loopback is in
test_chromium.py.)"""

import re

import httpx

from app.api.docs import FAVICON, REDOC_JS, STATIC, SWAGGER_CSS, SWAGGER_JS
from tests.support.problems import assert_problem

# `src=`, `href=` and Swagger UI's `url:` in the two pages.
REFERENCE = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""")
ASSETS = {
    SWAGGER_JS: ("text/javascript", 1_000_000),
    SWAGGER_CSS: ("text/css", 100_000),
    REDOC_JS: ("text/javascript", 1_000_000),
    FAVICON: ("image/png", 100),
}


def references(html: str) -> set[str]:
    return {a or b for a, b in REFERENCE.findall(html)}


async def test_docs_pages_reference_only_local_assets(
    client: httpx.AsyncClient,
) -> None:
    pages = {
        "/docs": {SWAGGER_JS, SWAGGER_CSS, FAVICON, "/openapi.json"},
        "/redoc": {REDOC_JS, FAVICON},
    }
    for path, expected in pages.items():
        response = await client.get(path)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/html")
        html = response.text
        assert expected <= references(html), (path, references(html))
        for url in references(html):
            assert url.startswith("/"), (path, url)
            assert not url.startswith("//"), (path, url)
        # No CDN, no web fonts: nothing in the page names another host, and the
        # browser is told to load nothing from one.
        assert "http://" not in html, (path, html)
        assert "https://" not in html, (path, html)
        policy = response.headers["content-security-policy"]
        assert "default-src 'self'" in policy
        assert "img-src 'self' data:" in policy
    redoc = (await client.get("/redoc")).text
    assert 'spec-url="/openapi.json"' in redoc


async def test_docs_assets_are_served_with_their_types(
    client: httpx.AsyncClient,
) -> None:
    for url, (content_type, least) in ASSETS.items():
        response = await client.get(url)
        assert response.status_code == 200, url
        assert response.headers["content-type"].split(";")[0] == content_type, url
        assert len(response.content) >= least, url
        path = STATIC / url.removeprefix("/static/")
        assert response.content == path.read_bytes(), url
        assert "etag" in response.headers, url
        head = await client.head(url)
        assert head.status_code == 200
        assert head.content == b""
        assert int(head.headers["content-length"]) == len(response.content)
    # The licenses ship beside the files.
    for directory in ("swagger-ui", "redoc"):
        assert (STATIC / directory / "LICENSE").stat().st_size > 500


async def test_unknown_static_paths_are_problem_json_404s(
    client: httpx.AsyncClient,
) -> None:
    for url in (
        "/static/nope.js",
        "/static/swagger-ui",
        "/static/",
        # An escape from the directory, percent-encoded so the client sends it as is.
        "/static/%2e%2e/docs.py",
        "/static/swagger-ui/%2e%2e/%2e%2e/main.py",
    ):
        assert_problem(await client.get(url), 404)
    assert_problem(await client.post(SWAGGER_JS), 405)

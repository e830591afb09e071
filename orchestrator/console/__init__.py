"""The web console: static files served by the orchestrator at `/` (no build step).

`index.html`, `console.js` and `console.css` are the page; `vendor/dagre/` holds the
vendored graph layout library with its licence. Every response of the console carries
`HEADERS`: a Content-Security-Policy that allows scripts, styles and requests from this
origin only and no inline script or style, so that text a model or a client wrote can
never run even if it reached the page as markup (the page builds its DOM from text
nodes: that is the first defence, this the second).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

CONSOLE_DIR = Path(str(resources.files(__package__)))
INDEX = CONSOLE_DIR / "index.html"

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
# Only the page's own files are served: not this module, nor anything else that lies
# in the package directory.
SERVED_SUFFIXES = (".html", ".js", ".css")


class ConsoleFiles(StaticFiles):
    """The console's files, with `HEADERS` on every response; mounted at `path`."""

    path = "/console"

    def __init__(self, **kw: Any) -> None:
        super().__init__(directory=CONSOLE_DIR, **kw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the request's route, for its log line and metrics (a mount sets none)
        scope.setdefault("route", self)
        await super().__call__(scope, receive, send)

    async def get_response(self, path: str, scope: Scope) -> Response:
        if not path.endswith(SERVED_SUFFIXES):
            # as StaticFiles answers a missing file: the app's handler gives the error body
            raise HTTPException(status_code=404)
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response

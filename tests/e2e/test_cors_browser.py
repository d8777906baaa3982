"""A browser page on another origin calls the real server (issue 13, acceptance 4).

The shared e2e server allows one loopback origin (tests/e2e/conftest.py CORS_PAGE_ORIGIN),
where one page server runs; a second page server on another port is not allowed. (The page
sends a bearer key the shared server does not check; a preflight before the auth check of a
server with a key is tests/omni/http/test_cors.py's.) Headless Chromium (Debian's package, which
bin/setup's test mode installs) loads the same page from each; its script POSTs a chat
completion with Authorization and a JSON body (so the browser sends a preflight first), then
the same request streamed, and writes the outcome into the DOM, which --dump-dom prints once
the page is idle (--virtual-time-budget waits for the fetches).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.e2e.chromium import CHROMIUM, HEADLESS
from tests.e2e.conftest import CORS_PAGE_ORIGIN, CORS_PAGE_PORT

KEY = "sk-browser-test"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (bin/setup test installs Debian's package where apt-get can)"
)

_SCRIPT = """
const API = new URLSearchParams(location.search).get("api"), KEY = %(key)s;
async function run() {
  const headers = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"};
  const body = {model: "omni-tiny", messages: [{role: "user", content: "hi"}], max_tokens: 3};
  const r = await fetch(API + "/v1/chat/completions", {method: "POST", headers, body: JSON.stringify(body)});
  const answer = await r.json();
  const s = await fetch(API + "/v1/chat/completions",
                        {method: "POST", headers, body: JSON.stringify({...body, stream: true})});
  const events = await s.text();
  return ["ok", r.status, answer.object, "id=" + r.headers.get("X-Request-Id"),
          "stream=" + s.status, "done=" + events.includes("data: [DONE]")].join(" ");
}
run().then(t => { document.getElementById("out").textContent = t; },
           e => { document.getElementById("out").textContent = "failed " + e.name; });
"""


PAGE = (
    '<!doctype html><html><body><pre id="out">pending</pre><script>'
    + _SCRIPT % {"key": json.dumps(KEY)}
    + "</script></body></html>"
).encode()


class _PageServer:
    """Serves PAGE (at any path; the API's URL is in the query) on a loopback port of its own,
    which makes its origin, from a thread."""

    def __init__(self, port: int = 0) -> None:
        page = PAGE

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.thread.join()
        self.httpd.server_close()


def _load(url: str, profile: Path) -> tuple[str, str]:
    """The text Chromium's run of the page left in #out (a fresh profile: no cached preflight),
    and its log, where the console's messages are (a CORS refusal's reason among them)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            *HEADLESS,
            "--enable-logging=stderr",  # with --v=0: console messages, as INFO:CONSOLE lines
            "--v=0",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=30000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    log = done.stderr.decode(errors="replace")
    found = re.search(r'<pre id="out">(.*?)</pre>', done.stdout.decode(), re.S)
    assert found is not None, f"chromium exited {done.returncode}: {log[-2000:]}"
    return html.unescape(found.group(1)), log


@pytest.fixture(scope="module")
def pages(server: str) -> Iterator[tuple[str, str]]:
    """(allowed page URL, other page URL), both calling the shared server, which allows the first."""
    allowed, other = _PageServer(CORS_PAGE_PORT), _PageServer()
    assert allowed.origin == CORS_PAGE_ORIGIN
    try:
        query = "/?" + urlencode({"api": server})
        yield allowed.origin + query, other.origin + query
    finally:
        allowed.close()
        other.close()


def test_a_page_on_an_allowed_origin_calls_the_api(pages: tuple[str, str], tmp_path: Path) -> None:
    text, log = _load(pages[0], tmp_path / "profile")
    assert "blocked by CORS policy" not in log
    outcome = text.split()
    assert outcome[:3] == ["ok", "200", "chat.completion"], outcome
    assert re.fullmatch(r"id=[0-9a-f]{32}", outcome[3]), outcome  # an exposed header the script may read
    assert outcome[4:] == ["stream=200", "done=true"], outcome


def test_a_page_on_another_origin_is_refused(pages: tuple[str, str], tmp_path: Path) -> None:
    # fetch rejects with a TypeError when the preflight is refused: the POST is never sent
    text, log = _load(pages[1], tmp_path / "profile")
    assert text == "failed TypeError"
    assert "blocked by CORS policy: Response to preflight request doesn't pass access control check" in log

"""The playground's routes (--ui): the page and its files are served without the API key, the
page's <base href> is the root path, / redirects to it, only the listed files are served, and
--no-ui serves none of it. The page in a browser is tests/e2e/test_playground.py's."""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from omni.config import ServerConfig, StoreConfig
from omni.http.app import create_app
from omni.http.handlers.playground import ASSETS, PLAYGROUND_PATH, model_hints, page_html, random_weights

KEY = "sk-page"
FOLDER = resources.files("omni.http") / "playground"


def _client(tmp_path: Path, **config: object) -> TestClient:
    app = create_app(ServerConfig(store=StoreConfig(f"local:{tmp_path}"), api_key=KEY, **config))  # type: ignore[arg-type]
    return TestClient(TestServer(app))


@pytest.mark.parametrize(("root_path", "paths"), [("", ["/playground", "/playground/"]),
                                                  ("/omni", ["/playground", "/omni/playground", "/omni/playground/"])])  # fmt: skip
async def test_the_page_is_served_without_the_key_under_its_root_path(tmp_path: Path, root_path: str, paths: list[str]) -> None:
    async with _client(tmp_path, root_path=root_path) as client:
        for path in paths:
            page = await client.get(path)
            assert page.status == 200 and page.content_type == "text/html"
            text = await page.text()
            # a proxy that strips the prefix and one that passes it: the browser sees the root path either way
            assert f'<base href="{root_path}/">' in text and "__ROOT_PATH__" not in text
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        for start in ("/", root_path or "/"):
            home = await client.get(start, allow_redirects=False)
            assert home.status == 302 and home.headers["Location"] == root_path + PLAYGROUND_PATH
        script = await client.get(root_path + "/playground/app.js")
        assert script.status == 200 and script.content_type == "text/javascript"
        assert await script.read() == (FOLDER / "app.js").read_bytes()
        assert (await client.get(root_path + "/v1/models")).status == 401  # the API still needs the key
        ok = await client.get(root_path + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status == 200


async def test_only_the_listed_files_are_served(tmp_path: Path) -> None:
    async with _client(tmp_path) as client:
        for name in ("index.html", "nothing.js", "..%2Fhandlers%2Fplayground.py"):
            assert (await client.get(f"/playground/{name}")).status == 404, name
        assert (await client.get("/playground/../app.py")).status in (401, 404)  # normalised to /app.py: no route


async def test_no_ui_serves_no_page(tmp_path: Path) -> None:
    async with _client(tmp_path, ui=False) as client:
        for path in ("/playground", "/playground/app.js"):
            assert (await client.get(path)).status == 401  # no open path without the page: the key is asked first
        authorized = {"Authorization": f"Bearer {KEY}"}
        for path in ("/", "/playground", "/playground/app.js"):
            assert (await client.get(path, headers=authorized, allow_redirects=False)).status == 404


def test_the_listed_files_are_the_folder_and_every_file_the_page_loads_is_listed() -> None:
    on_disk = {f.name for f in FOLDER.iterdir() if f.is_file()}
    assert on_disk == set(ASSETS) | {"index.html"}
    page = (FOLDER / "index.html").read_text()
    loaded = set(re.findall(r'(?:src|href)="playground/([^"]+)"', page))
    for name in ASSETS:
        if name.endswith(".js"):
            text = (FOLDER / name).read_text()
            loaded |= set(re.findall(r'from "\./([^"]+)"', text))
            loaded |= set(re.findall(r'url\("playground/([^"]+)"\)', text))
            assert "http://" not in text and "https://" not in text, name  # no CDN, no other host
    assert loaded == set(ASSETS), loaded ^ set(ASSETS)


def _served(name: str, model_dir: Path, *, makes: bool = False, hears: bool = False) -> Any:
    return SimpleNamespace(name=name, pool=SimpleNamespace(config=SimpleNamespace(model_dir=model_dir)),
                           outputs=(object(),) if makes else (), media=object() if hears else None)  # fmt: skip


def test_chat_opens_on_a_trained_model_and_images_and_voice_on_one_that_makes_them(tmp_path: Path) -> None:
    """The embedded default (random_weights in its config.json) first, SmolLM2 (a GGUF file) beside
    it: chat opens on SmolLM2; alone, or among random models only, the first model is opened."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps({"model_type": "vlm", "random_weights": True}))
    gguf = tmp_path / "smollm2.gguf"
    gguf.write_bytes(b"GGUF")
    omni, smol = _served("omni-tiny", tiny, makes=True, hears=True), _served("smollm2", gguf)
    assert model_hints([omni, smol]) == {"chat": "smollm2", "images": "omni-tiny", "voice": "omni-tiny"}
    assert model_hints([omni]) == {"chat": "omni-tiny", "images": "omni-tiny", "voice": "omni-tiny"}
    assert model_hints([smol]) == {"chat": "smollm2", "images": "smollm2", "voice": "smollm2"}
    assert model_hints([]) == {}
    assert random_weights(tiny) and not random_weights(gguf) and not random_weights(tmp_path / "missing")


def test_the_page_carries_the_hints_for_its_script() -> None:
    text = page_html("/omni", {"chat": "smollm2", "images": 'a"b<c'})
    (content,) = re.findall(r'<meta name="omni-models" content="([^"]*)">', text)
    assert json.loads(html.unescape(content)) == {"chat": "smollm2", "images": 'a"b<c'}

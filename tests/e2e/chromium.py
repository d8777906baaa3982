"""Debian's chromium for the browser tests: where it is, and the flags every headless run takes."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium")

HEADLESS = [
    "--headless=new",
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a container's /dev/shm is small
    "--disable-background-networking",
    "--no-first-run",
]

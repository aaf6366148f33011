"""A real browser for tests: Debian's chromium, headless, driven over WebDriver by selenium
through Debian's chromium-driver (both installed by infra/setup.sh; selenium and pillow are dev
extras). WebDriver sessions rather than chromium's one-shot ``--screenshot`` mode, which failed
under heavy load here (NOTES.md). Used by the viewer's and the Temporal UI's browser tests.

`chromium()` skips when either binary is missing (under CI=true that skip fails: the setup is
broken, tests/_ci_strict.py). The driver paths are given explicitly, so selenium never tries to
download a driver (Selenium Manager needs the network).
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless chromium WebDriver session with a ``width`` x ``height`` viewport at device
    scale 1 (a CSS pixel is a screenshot pixel), quit on exit."""
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("chromium / chromium-driver not installed (run infra/setup.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
        f"--window-size={width},{height}", "--force-device-scale-factor=1", "--no-first-run",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def image(png: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


def dominant_colour(png: bytes) -> tuple[int, int, int]:
    """The most frequent pixel colour of a PNG (a token's background, not its glyphs)."""
    colours = image(png).getcolors(maxcolors=1 << 20) or []
    return max(colours)[1]


def distinct_colours(png: bytes) -> int:
    return len(image(png).getcolors(maxcolors=1 << 20) or [])

"""The web page at / in a real browser: headless Chromium driven by playwright.

Needs Chromium at /usr/bin/chromium (or $XFORMER_CHROMIUM); .ci/run installs it. Skipped
where it is missing, except under CI (CI=true), where that is a failure.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from serve_helpers import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    path = os.environ.get("XFORMER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {path}; .ci/run installs it (apt-get install chromium)")
        pytest.skip("no Chromium (apt-get install chromium, or set XFORMER_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:  # playwright gives the browser a fresh profile of its own
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_the_page_translates_as_you_type(trained_run, browser, tmp_path):
    server = ServerProcess("-m", trained_run / "best.pt", "--precision", "fp32", "--threads", "1", "--name", "tiny-test-model")
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 640})
        posts = []
        page.on("request", lambda req: posts.append(req.url) if req.method == "POST" else None)
        page.goto(server.url + "/")
        assert page.text_content("#model-name") == "tiny-test-model"
        assert page.text_content("#source-name") == "English" and page.text_content("#target-name") == "German"
        page.click("#source")
        page.keyboard.type("A dog runs in the grass.", delay=20)  # keystrokes: debounced into few requests
        page.wait_for_function("""() => {
            const out = document.querySelector('#output');
            return !out.classList.contains('placeholder') && !out.classList.contains('stale') && out.textContent.trim();
        }""", timeout=30_000)
        timing = page.text_content("#timing")
        assert re.search(r"decoded in \d+ ms", timing) and re.search(r"\d+ ms round trip", timing), timing
        page.screenshot(path=os.environ.get("XFORMER_SCREENSHOT") or str(tmp_path / "page.png"))  # to look at
        assert 1 <= len(posts) <= 4, posts  # 24 keystrokes, debounced

        page.fill("#source", "")  # cleared: the placeholder comes back
        page.wait_for_function("() => document.querySelector('#output').classList.contains('placeholder')")
    finally:
        server.close()


def test_the_page_asks_for_the_api_key_and_retries_with_it(trained_run, browser):
    server = ServerProcess("-m", trained_run / "best.pt", "--precision", "fp32", "--threads", "1", "--api-key", "k3y")
    try:
        page = browser.new_page()
        page.goto(server.url + "/")
        assert page.is_visible("#api-key")
        page.fill("#source", "Two dogs play.")
        page.wait_for_function("() => document.querySelector('#timing').textContent.includes('API key')", timeout=30_000)
        assert page.text_content("#output") == "The translation appears here."
        page.fill("#api-key", "k3y")  # the same text goes again, with the key
        page.wait_for_function("() => !document.querySelector('#output').classList.contains('placeholder')",
                               timeout=30_000)
        assert "ms round trip" in page.text_content("#timing")
    finally:
        server.close()

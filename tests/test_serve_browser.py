"""The web page at / in a real browser: headless Chromium driven by playwright.

Needs Chromium at /usr/bin/chromium (or $XFORMER_CHROMIUM); .ci/run installs it. Skipped
where it is missing, except under CI (CI set to 1, true or yes), where that is a failure.
"""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from serve_helpers import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def under_ci() -> bool:
    """Whether $CI says this is CI: 1, true or yes (any case), as CI services set it; CI=0,
    false or an empty value is a developer's machine, where a missing browser skips."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _chromium() -> str:
    path = os.environ.get("XFORMER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        if under_ci():
            pytest.fail(f"no Chromium at {path}; .ci/run installs it (apt-get install chromium)")
        pytest.skip("no Chromium (apt-get install chromium, or set XFORMER_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if under_ci():
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


class UpperCaser:
    """A fake engine, so that the page's requests, not a model, are under test."""

    name, engine, precision, source, target, beam_size, truncated_lines = "fake/model.pt", "xformer", "fp32", "en", "de", 4, 0

    def translate(self, texts, beam_size=None, **options):  # options: format, glossary, ...
        return [text.upper() for text in texts]


PARAGRAPHS = ("A man rides a bike down the street. He wears a red helmet and waves at the children.\n"
              "Two dogs are playing in the snow. One of them carries a stick.\n\n"
              "The Berlin Philharmonic plays tonight. Tickets are on xformer.example.")
TEXT = "\n".join([PARAGRAPHS] * 3)
GLOSSARY = "Berlin Philharmonic = Berliner Philharmoniker\nxformer\n"


def _settled(page) -> None:
    page.wait_for_function("""() => {
        const out = document.querySelector('#output');
        return !out.classList.contains('placeholder') && !out.classList.contains('stale') && out.textContent.trim();
    }""", timeout=30_000)


def test_the_page_sends_paragraphs_the_glossary_and_html(browser, tmp_path):
    from serve_helpers import real_server

    from xformer_cli.serve.app import create_app

    with real_server(create_app(UpperCaser())) as url:
        page = browser.new_page(viewport={"width": 1100, "height": 900})

        def answer(route):  # format html is answered here: the server's HTML path is tested on its own
            body = route.request.post_data_json
            if body.get("format") == "html":
                route.fulfill(status=200, content_type="application/json",
                              body=json.dumps({"translatedText": "<p>" + body["q"].upper() + "</p>"}))
            else:
                route.continue_()

        page.route("**/translate", answer)
        page.goto(url + "/")
        empty_height = page.eval_on_selector("#source", "e => e.offsetHeight")
        with page.expect_request("**/translate") as sent:
            page.fill("#source", TEXT)
        assert sent.value.post_data_json == {"q": TEXT.split("\n"), "source": "en", "target": "de", "format": "text"}
        _settled(page)
        assert page.text_content("#output") == (TEXT).upper()
        assert page.eval_on_selector("#source", "e => e.offsetHeight") > empty_height  # it grew with the text

        page.click("#glossary-box summary")
        with page.expect_request("**/translate") as sent:
            page.fill("#glossary", GLOSSARY)
        assert sent.value.post_data_json["glossary"] == {"Berlin Philharmonic": "Berliner Philharmoniker", "xformer": "xformer"}
        assert page.text_content("#glossary-count") == "2 terms"
        _settled(page)
        page.screenshot(path=os.environ.get("XFORMER_SCREENSHOT") or str(tmp_path / "page.png"), full_page=True)

        with page.expect_request("**/translate") as sent:
            page.check("#html")
        body = sent.value.post_data_json
        assert (body["format"], body["q"], body["glossary"]["xformer"]) == ("html", TEXT, "xformer")
        _settled(page)
        assert page.text_content("#output") == "<p>" + (TEXT).upper() + "</p>"  # shown as text, not rendered

        requests = []
        page.on("request", lambda req: requests.append(req) if req.method == "POST" else None)
        page.fill("#glossary", "Berlin =")  # a line without its target: said on the page, not sent
        page.wait_for_function("() => document.querySelector('#timing').textContent.includes('Glossary line 1')")
        assert requests == []
        page.reload()  # the toggle and the glossary are remembered
        assert page.is_checked("#html") and page.input_value("#glossary") == "Berlin ="


def test_the_page_offers_a_multilingual_models_target_languages(browser, tmp_path):
    """A model of several directions: a target picker (its languages), and a source picker
    (detection, or the sources into that target) where there is more than one."""
    from multilingual_fixture import FakeMultilingual
    from serve_helpers import real_server
    from xformer_cli.serve.app import create_app

    engine = FakeMultilingual()
    with real_server(create_app(engine)) as url:
        page = browser.new_page(viewport={"width": 1100, "height": 640})
        page.goto(url + "/")
        values = lambda selector: page.eval_on_selector_all(f"{selector} option", "els => els.map(e => e.value)")  # noqa: E731
        assert values("#target-lang") == ["de", "fr", "en"] and page.is_visible("#target-lang")
        assert not page.is_visible("#source-lang") and page.text_content("#source-name") == "English"
        page.select_option("#target-lang", "fr")
        page.fill("#source", "A man rides a bike.")
        page.wait_for_function("() => document.querySelector('#output').textContent.startsWith('fr: ')", timeout=30_000)
        assert engine.calls[-1][1:] == ("fr", "en")
        page.select_option("#target-lang", "en")  # into English: from German or French, or detected
        assert values("#source-lang") == ["auto", "de", "fr"] and page.is_visible("#source-lang")
        page.fill("#source", "Zwei Hunde spielen im Schnee mit einem roten Ball.")
        page.wait_for_function("() => document.querySelector('#output').textContent.startsWith('en: ')", timeout=30_000)
        assert engine.calls[-1][1:] == ("en", "de")  # source auto, detected as German
        page.screenshot(path=os.environ.get("XFORMER_SCREENSHOT_MULTI") or str(tmp_path / "page-multilingual.png"))

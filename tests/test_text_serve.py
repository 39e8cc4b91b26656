"""POST /translate with format html, a glossary, sentence splitting and real alternatives,
through ServedModel and the batcher (a fake engine)."""

import pytest

from text_fakes import FakeEngine

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from xformer_cli.serve.app import create_app  # noqa: E402
from xformer_cli.serve.engine import ServedModel  # noqa: E402


def served(engine=None):
    engine = engine or FakeEngine()
    return ServedModel(engine, "fake", "xformer", "fp32", "en", "de", 4)


def post(client, **body):
    return client.post("/translate", json={"source": "en", "target": "de", **body})


def test_paragraphs_html_glossary_and_alternatives():
    with TestClient(create_app(served())) as client:
        res = post(client, q="A dog.\n\nA cat.")
        assert res.json() == {"translatedText": "A DOG.\n\nA CAT."}
        res = post(client, q="<p>A <b>dog</b> runs.</p>", format="html")
        assert res.json() == {"translatedText": "<p>A <b>DOG</b> RUNS.</p>"}
        res = post(client, q="The dog runs.", glossary={"dog": "Köter"})
        assert "Köter" in res.json()["translatedText"]
        res = post(client, q="A dog. A cat.", alternatives=2)
        assert res.json() == {"translatedText": "A DOG. A CAT.",
                              "alternatives": ["A DOG. ~1 A CAT. ~1", "A DOG. ~2 A CAT. ~2"]}
        res = post(client, q="A dog. A cat.", split_sentences=False)
        assert res.json() == {"translatedText": "A DOG. A CAT."}


@pytest.mark.parametrize("glossary", [["dog"], {"dog": ""}, {"dog": 5}, "not json", "[" * 100_000])
def test_a_bad_glossary_is_a_json_400(glossary):
    with TestClient(create_app(served())) as client:
        res = post(client, q="A dog.", glossary=glossary)
        assert res.status_code == 400 and "glossary" in res.json()["error"]


def test_a_glossary_beside_a_number_longer_than_pythons_int_conversion_is_translated():
    """The numbers' check reads digit runs of any length (int() refuses over 4300 digits: a 500)."""
    with TestClient(create_app(served())) as client:
        for digits in ("1" * 4900, "\u0661" * 4900):
            res = post(client, q=f"A dog {digits}.", glossary={"dog": "Köter"}, split_sentences=False)
            assert res.status_code == 200 and "Köter" in res.json()["translatedText"], res.text


def test_broken_html_is_translated_not_a_crash():
    with TestClient(create_app(served())) as client:
        res = post(client, q="<p>broken <b>bold", format="html")
        assert res.status_code == 200 and res.json()["translatedText"] == "<p>BROKEN <b>BOLD"

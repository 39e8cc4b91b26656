"""xformer serve: the HTTP API through starlette's TestClient (a fake engine, then a tiny
trained model on both engines), and a real server process that drains on SIGTERM. The
micro-batcher alone is tested in test_batcher.py."""

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_helpers import ServerProcess, get, request


# -- the HTTP API with a fake engine -------------------------------------------------------------

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from xformer_cli.serve.app import create_app  # noqa: E402
from xformer_cli.serve.protocol import Limits  # noqa: E402
from xformer_cli.text import TextResult  # noqa: E402


class FakeEngine:
    name, engine, precision, source, target, beam_size, truncated_lines = "fake/model.pt", "xformer", "fp32", "en", "de", 4, 0

    def __init__(self, gate: "threading.Event | None" = None):
        self.gate, self.entered, self.calls = gate, threading.Event(), []

    def translate(self, texts, beam_size=None, alternatives=0, wanted=None):
        self.calls.append((list(texts), beam_size))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if "crash" in texts:
            raise RuntimeError("out of memory, say")
        out = [f"[{beam_size}] {text[::-1]}" if text.strip() else "" for text in texts]
        if alternatives:  # the n-best: the k-th alternative says its rank
            return [TextResult(text, [f"{text} #{k}" for k in range(1, alternatives + 1)]) for text in out]
        return out


def client_for(engine=None, **kwargs) -> TestClient:
    kwargs.setdefault("limits", Limits(max_chars=50, max_texts=4, max_body=4096))
    return TestClient(create_app(engine or FakeEngine(), **kwargs))


def post(client, **body):
    return client.post("/translate", json=body)


def test_translate_one_text_and_a_list():
    with client_for() as client:
        res = post(client, q="Hello", source="en", target="de", format="text")
        assert res.status_code == 200 and res.json() == {"translatedText": "[4] olleH"}
        assert "decode;dur=" in res.headers["server-timing"] and res.headers["x-batch-texts"] == "1"

        res = post(client, q=["one", "", "two"], source="en", target="de", beam_size=2)
        assert res.json() == {"translatedText": ["[2] eno", "", "[2] owt"]}

        res = post(client, q="Hi", source="auto", target="de", alternatives=3)  # LibreTranslate's extras
        assert res.json() == {"translatedText": "[4] iH", "alternatives": ["[4] iH #1", "[4] iH #2", "[4] iH #3"],
                              "detectedLanguage": {"language": "en", "confidence": 100.0}}

        res = client.post("/translate", data={"q": "form", "source": "en", "target": "de"})  # an HTML form
        assert res.json() == {"translatedText": "[4] mrof"}
        res = client.post("/translate", content=b'{"q": "curl", "source": "en", "target": "de"}',
                          headers={"Content-Type": "application/x-www-form-urlencoded"})  # curl -d '{...}'
        assert res.json() == {"translatedText": "[4] lruc"}


def test_languages_health_and_page():
    with client_for() as client:
        assert client.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", "name": "German", "targets": []}]
        post(client, q="warm", source="en", target="de")
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["model"] == "fake/model.pt" and health["beam_size"] == 4
        assert (health["requests"], health["texts"], health["queued"]) == (1, 1, 0)
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '"model": "fake/model.pt"' in page.text and "__XFORMER_CONFIG__" not in page.text
        # offline: no outside scripts, styles, fonts or images
        assert "http://" not in page.text and "https://" not in page.text and "<link" not in page.text


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "empty body"),
    (b"[1, 2]", 400, "JSON object"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b'{"source": "en", "target": "de"}', 400, "missing q"),
    (b'{"q": "x", "target": "de"}', 400, "missing source"),
    (b'{"q": "x", "source": "en"}', 400, "missing target"),
    (b'{"q": "", "source": "en", "target": "de"}', 400, "q is empty"),
    (b'{"q": [], "source": "en", "target": "de"}', 400, "q is empty"),
    (b'{"q": ["  ", ""], "source": "en", "target": "de"}', 400, "q is empty"),
    (b'{"q": 5, "source": "en", "target": "de"}', 400, "string or a list"),
    (b'{"q": ["a", 5], "source": "en", "target": "de"}', 400, "string or a list"),
    (b'{"q": "x", "source": "fr", "target": "de"}', 400, "this model translates en->de"),
    (b'{"q": "x", "source": "en", "target": "fr"}', 400, "not supported"),
    (b'{"q": "x", "source": ["en"], "target": "de"}', 400, "language code"),
    (b'{"q": "x", "source": "en", "target": "de", "format": "xml"}', 400, "only text or html"),
    (b'{"q": "x", "source": "en", "target": "de", "beam_size": 0}', 400, "beam_size"),
    (b'{"q": "x", "source": "en", "target": "de", "beam_size": "wide"}', 400, "beam_size"),
    (b'{"q": "x", "source": "en", "target": "de", "beam_size": true}', 400, "beam_size"),
    (b'{"q": "x", "source": "en", "target": "de", "alternatives": -1}', 400, "alternatives"),
    (json.dumps({"q": "x" * 51, "source": "en", "target": "de"}).encode(), 400, "at most 50 per text"),
    (json.dumps({"q": ["x"] * 5, "source": "en", "target": "de"}).encode(), 400, "at most 4"),
    (json.dumps({"q": "x" * 5000, "source": "en", "target": "de"}).encode(), 413, "4096"),
    (b'{"q": "a\\ud800b", "source": "en", "target": "de"}', 400, "lone surrogate"),  # JSON can say it, text cannot
    (b'{"q": "a", "source": "\\udfff", "target": "de"}', 400, "not valid Unicode"),
    (b'{"q": "x", "source": "en", "target": "de", "beam_size": "--3"}', 400, "beam_size"),
    (b'{"q": "x", "source": "en", "target": "de", "alternatives": "\xc2\xb2"}', 400, "alternatives"),  # a superscript 2
    (b'{"q": "x", "source": "en", "target": "de", "split_sentences": "banana"}', 400, "split_sentences"),  # was true
])
def test_bad_requests_get_a_4xx_json_error(body, status, fragment):
    engine = FakeEngine()
    with client_for(engine) as client:
        res = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
        assert res.status_code == status, res.text
        assert res.headers["content-type"] == "application/json" and set(res.json()) == {"error"}
        assert fragment in res.json()["error"] and "Traceback" not in res.text
        assert post(client, q="still alive", source="en", target="de").status_code == 200
    assert [texts for texts, _ in engine.calls] == [["still alive"]]  # nothing bad reached the engine


def test_forms_multipart_and_url_encoded_as_libretranslate_reads_them():
    with client_for() as client:
        res = client.post("/translate", data={"q": ["ab", "cd"], "source": "en", "target": "de"})
        assert res.status_code == 200 and res.json() == {"translatedText": ["[4] ba", "[4] dc"]}
        # a browser's FormData: multipart/form-data, q repeated for several texts
        multipart = client.post("/translate", files=[("q", (None, "ab")), ("q", (None, "cd")), ("source", (None, "en")),
                                                     ("target", (None, "de")), ("beam_size", (None, "2"))])
        assert multipart.status_code == 200 and multipart.json() == {"translatedText": ["[2] ba", "[2] dc"]}
        upload = client.post("/translate", files={"q": ("a.txt", b"ab")}, data={"source": "en", "target": "de"})
        assert upload.status_code == 400 and "form could not be read" in upload.json()["error"]  # a file is no text
        bad = client.post("/translate", content=b"q=%FF%FE&source=en&target=de",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert bad.status_code == 400 and "not UTF-8" in bad.json()["error"]


class BrokenLanguages(FakeEngine):
    broken = False

    @property
    def languages(self):
        if self.broken:
            raise RuntimeError("a bug")
        return None


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_bytes_that_are_no_http_get_a_json_400_and_the_server_serves_on(http, monkeypatch):
    import socket

    import uvicorn
    from serve_helpers import real_server

    # each parser uvicorn may pick (h11 comes with it; httptools with uvicorn[standard] and the dev extra)
    real_config = uvicorn.Config
    monkeypatch.setattr(uvicorn, "Config", lambda app, **kwargs: real_config(app, http=http, **kwargs))
    # a head never ended: httptools bounded none (one such client slowed everyone); 400 past 16 KiB with either
    endless_header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000
    with real_server(create_app(FakeEngine())) as url:
        host, port = url.removeprefix("http://").split(":")
        for garbage in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n", endless_header):
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(garbage)
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), answer
            assert b"\r\ndate: " in head.lower()  # uvicorn's default headers, as on every other answer
            assert json.loads(body)["error"].startswith("malformed HTTP request: "), body
        assert get(url + "/health")[0] == 200  # everyone else is still served
        # a long body and a 12 KiB head are no head past the bound: the app answers them
        status, body, _ = request(url + "/translate", {"q": ["x"] * 30_000, "source": "en", "target": "de"},
                                  headers={"X-Note": "n" * 12_000})
        assert status == 400 and "malformed" not in body["error"], body


def test_head_where_get_answers_and_a_bug_is_a_json_500_that_carries_cors():
    engine = BrokenLanguages()
    with client_for(engine, cors=["http://a.example"]) as client:
        for path in ("/", "/health", "/languages"):
            res = client.head(path)
            assert res.status_code == 200 and res.content == b"", path
        engine.broken = True
        res = client.get("/languages", headers={"Origin": "http://a.example"})
        assert res.status_code == 500 and res.json() == {"error": "internal error (RuntimeError)"}
        assert res.headers["access-control-allow-origin"] == "http://a.example"  # a browser can read it
        engine.broken = False
        assert post(client, q="still here", source="en", target="de").status_code == 200  # and it lives on


def test_unknown_paths_and_methods_answer_json():
    with client_for() as client:
        assert client.get("/nope").status_code == 404 and client.get("/nope").json() == {"error": "Not Found"}
        res = client.get("/translate")
        assert res.status_code == 405 and "error" in res.json()


def test_api_key():
    with client_for(api_key="s3cret") as client:
        body = dict(q="x", source="en", target="de")
        assert post(client, **body).status_code == 403
        res = post(client, **body, api_key="wrong")
        assert res.status_code == 403 and res.json() == {"error": "Invalid API key"}
        assert post(client, **body, api_key="s3cret").status_code == 200  # LibreTranslate's field
        assert client.post("/translate", json=body, headers={"X-API-Key": "s3cret"}).status_code == 200
        assert client.post("/translate", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.post("/translate", json=body, headers={"Authorization": "Bearer nope"}).status_code == 403
        assert client.get("/languages").status_code == 200 and client.get("/health").json()["api_key_required"]


def test_a_full_queue_answers_503_with_retry_after():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    with client_for(engine, batcher=dict(max_wait=0.0, max_queued=4)) as client:
        queue = client.app.state.batcher
        running = queue.submit(["held"])  # the engine blocks on it
        assert engine.entered.wait(5)
        waiting = queue.submit(["a", "b", "c"])
        res = post(client, q=["one", "two"], source="en", target="de")  # 3 + 2 > 4
        assert res.status_code == 503 and res.headers["retry-after"] == "1" and "busy" in res.json()["error"]
        assert client.get("/health").json()["rejected"] == 1
        gate.set()
        assert running.result(5).texts and waiting.result(5).texts
        assert post(client, q=["one", "two"], source="en", target="de").status_code == 200


def test_an_engine_failure_is_a_500_json_and_the_server_lives_on():
    with client_for() as client:
        res = post(client, q="crash", source="en", target="de")
        assert res.status_code == 500 and res.json() == {"error": "translation failed (RuntimeError)"}
        assert post(client, q="fine", source="en", target="de").json() == {"translatedText": "[4] enif"}


def test_concurrent_http_requests_are_batched():
    engine = FakeEngine()
    with client_for(engine, batcher=dict(max_wait=0.5, max_sentences=6)) as client:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: post(client, q=f"text {i}", source="en", target="de"), range(6)))
        assert [a.json()["translatedText"] for a in answers] == [f"[4] {i} txet" for i in range(6)]
        assert len(engine.calls) < 6  # shared engine calls (one, unless the machine is very slow)


# -- a tiny trained model, both engines ----------------------------------------------------------

from xformer_cli.serve.engine import load_served_model  # noqa: E402

SENTENCES = ["A dog runs in the grass.", "", "Two men are playing soccer.", "A woman sings."]


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two torch threads on two busy cores spin more than they compute
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_a_trained_model_over_http_translates_like_the_translator(trained_run, one_thread):
    from xformer_cli.decode.translator import Translator

    checkpoint = trained_run / "best.pt"
    expected = Translator.from_checkpoint(checkpoint, device="cpu", precision="fp32").translate(SENTENCES)
    engine = load_served_model(checkpoint, "xformer", device="cpu", precision="fp32")
    assert (engine.source, engine.target, engine.precision, engine.name) == ("en", "de", "fp32", f"{trained_run.name}/best.pt")
    with TestClient(create_app(engine)) as client:
        assert post(client, q=SENTENCES, source="en", target="de").json() == {"translatedText": expected}
        assert post(client, q=SENTENCES[0], source="en", target="de").json() == {"translatedText": expected[0]}
        with ThreadPoolExecutor(4) as pool:  # one at a time or batched with others: the same outputs
            answers = list(pool.map(lambda s: post(client, q=s, source="en", target="de").json(), SENTENCES * 2))
        for sentence, answer in zip(SENTENCES * 2, answers):
            if sentence.strip():
                assert answer == {"translatedText": expected[SENTENCES.index(sentence)]}
            else:
                assert answer == {"error": "Invalid request: q is empty"}
        languages = client.get("/languages").json()
        assert languages[0]["code"] == "en" and languages[0]["targets"] == ["de"]


@pytest.mark.slow
def test_ctranslate2_engine_from_an_export_and_from_a_checkpoint(trained_run, tmp_path, one_thread):
    pytest.importorskip("ctranslate2")
    from xformer_cli.decode.translator import Translator
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    checkpoint = trained_run / "best.pt"
    greedy = Translator.from_checkpoint(checkpoint, device="cpu", precision="fp32").translate(SENTENCES, beam_size=1)
    exported = export_ctranslate2(checkpoint, tmp_path / "ct2")
    from_dir = load_served_model(exported, "ctranslate2", device="cpu", target="de-DE")  # an override wins
    assert (from_dir.source, from_dir.target, from_dir.engine, from_dir.name) == ("en", "de-DE", "ctranslate2", "ct2")
    on_the_fly = load_served_model(checkpoint, "ctranslate2", device="cpu", precision="fp32")
    assert (on_the_fly.source, on_the_fly.target, on_the_fly.precision) == ("en", "de", "float32")
    int8 = load_served_model(checkpoint, "auto", device="cpu", precision="int8")  # as xformer translate --precision int8
    assert (int8.engine, int8.precision, int8.source, int8.target) == ("ctranslate2", "int8", "en", "de")
    assert len(int8.translate(SENTENCES, beam_size=1)) == len(SENTENCES)
    for engine, target in ((from_dir, "de-DE"), (on_the_fly, "de")):
        with TestClient(create_app(engine)) as client:  # greedy CTranslate2 equals greedy xformer
            res = post(client, q=SENTENCES, source="en", target=target, beam_size=1)
            assert res.json() == {"translatedText": greedy}


def test_source_and_target_respell_a_bilingual_models_languages_and_never_change_them(tmp_path):
    from xformer_cli.errors import XformerError
    from xformer_cli.languages import Languages
    from xformer_cli.serve.engine import served_languages

    model, said = Languages.of([("en", "de")]), []
    assert served_languages(model, None, None, said.append, tmp_path).pairs == (("en", "de"),)
    assert served_languages(model, "eng", "de-DE", said.append, tmp_path).pairs == (("eng", "de-DE"),)
    for source, target, flag in (("fr", None, "--source fr"), (None, "en", "--target en"), ("de", "en", "--source de")):
        with pytest.raises(XformerError, match=f"{flag}: .* translates en->de only"):
            served_languages(model, source, target, said.append, tmp_path)
    assert said == []
    unnamed = served_languages(None, "fr", "cs", said.append, tmp_path)  # a model that records no codes
    assert unnamed.pairs == (("fr", "cs"),) and said == []
    assert served_languages(None, None, None, said.append, tmp_path).pairs == (("en", "de"),) and "records no" in said[0]


# -- a real server process -----------------------------------------------------------------------

@pytest.mark.slow
def test_server_process_batches_and_drains_on_sigterm(trained_run):
    # --max-wait-ms 1500: a lone request waits 1.5 s for company, so it is surely in flight at SIGTERM
    server = ServerProcess("-m", trained_run / "best.pt", "--precision", "fp32", "--threads", "1",
                           "--max-wait-ms", "1500", "--max-batch", "8")
    try:
        url = server.url
        assert url.startswith("http://127.0.0.1:")
        with ThreadPoolExecutor(8) as pool:  # 8 clients at once fill one batch of 8
            answers = list(pool.map(lambda i: request(url + "/translate", dict(q=f"A dog number {i}.", source="en", target="de")),
                                    range(8)))
        assert all(status == 200 and body["translatedText"] for status, body, _ in answers)
        health = get(url + "/health")[1]
        assert health["requests"] == 8 and health["batches"] < 8

        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(request, url + "/translate", dict(q=["A man sleeps.", "A cat."], source="en", target="de"))
            deadline = time.monotonic() + 10
            while get(url + "/health")[1]["queued"] < 2:  # the request waits in the batcher
                assert time.monotonic() < deadline, "the request never reached the queue"
                time.sleep(0.02)
            server.proc.send_signal(signal.SIGTERM)
            status, body, _ = in_flight.result(30)
        assert status == 200 and len(body["translatedText"]) == 2 and all(body["translatedText"])
        assert server.proc.wait(30) == 0, server.output()
        with pytest.raises(OSError):  # gone: nothing listens any more
            get(url + "/health", timeout=2)
    finally:
        server.close()


@pytest.mark.slow
def test_serve_errors_are_one_line(tmp_path):
    from helpers import assert_one_line_error, xformer

    assert_one_line_error(xformer("serve", "-m", tmp_path / "missing.pt", "--port", "0"), "not found")
    assert_one_line_error(xformer("serve", "-m", tmp_path, "--port", "0"), "--engine ctranslate2")
    assert_one_line_error(xformer("serve", "-m", tmp_path, "--engine", "onnx"), "--engine")
    assert_one_line_error(xformer("serve", "-m", tmp_path, "--max-texts", "9", "--max-queue", "4"), "--max-queue")
    hidden = "import sys; sys.modules['fastapi'] = None"
    assert_one_line_error(xformer("serve", "-m", tmp_path, python_prelude=hidden), "pip install 'xformer[serve]'")

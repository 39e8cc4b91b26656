"""xformer serve beyond POST /translate: LibreTranslate's /detect, /frontend/settings,
/translate_file and /download_file, source "auto" refusing other languages, CORS, hostile
clients (vanished ones, deeply nested JSON), and clients written for LibreTranslate
(libretranslate-py's and deep-translator's request shapes). A fake engine throughout; a
real uvicorn in a thread where the test needs real sockets."""

import json
import socket
import threading
import time
import urllib.parse
import urllib.request

import pytest

from serve_helpers import real_server

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from xformer_cli.serve import detect  # noqa: E402
from xformer_cli.serve.app import create_app  # noqa: E402
from xformer_cli.serve.files import FileStore, split_lines  # noqa: E402
from xformer_cli.serve.protocol import ApiError, Limits  # noqa: E402

GERMAN = "Zwei Hunde spielen im Schnee."
ENGLISH = "Two dogs are playing in the snow."


class FakeEngine:
    name, engine, precision, source, target, beam_size, truncated_lines = "fake/model.pt", "xformer", "fp32", "en", "de", 4, 0

    def __init__(self, gate: "threading.Event | None" = None):
        self.gate, self.entered, self.calls = gate, threading.Event(), []

    def translate(self, texts, beam_size=None, **options):
        self.calls.append(list(texts))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return [text.upper() for text in texts]


def client_for(engine=None, **kwargs) -> TestClient:
    kwargs.setdefault("limits", Limits(max_chars=200, max_texts=3))
    return TestClient(create_app(engine or FakeEngine(), **kwargs))


def assert_json_error(res, status: int, fragment: str = "") -> None:
    assert res.status_code == status, res.text
    assert res.headers["content-type"] == "application/json" and set(res.json()) == {"error"}, res.text
    assert fragment in res.json()["error"]


# -- language detection -------------------------------------------------------------------------

def test_detect_answers_libretranslates_shape():
    with client_for() as client:
        found = client.post("/detect", json={"q": GERMAN}).json()
        assert found[0]["language"] == "de" and 90 <= found[0]["confidence"] <= 100
        assert all(set(c) == {"confidence", "language"} for c in found)
        assert [c["confidence"] for c in found] == sorted((c["confidence"] for c in found), reverse=True)
        assert client.post("/detect", data={"q": "Le chat est sur la table."}).json()[0]["language"] == "fr"
        assert_json_error(client.post("/detect", json={"source": "en"}), 400, "missing q")
        assert_json_error(client.post("/detect", json={"q": "  "}), 400, "empty")
        assert_json_error(client.post("/detect", json={"q": "x" * 201}), 400, "at most 200")


def test_auto_source_refuses_text_plainly_in_another_language():
    engine = FakeEngine()
    with client_for(engine) as client:
        res = client.post("/translate", json={"q": GERMAN, "source": "auto", "target": "de"})
        assert_json_error(res, 400, "q is in German (de")
        res = client.post("/translate", json={"q": [ENGLISH, "Le chien court dans le jardin."], "source": "auto", "target": "de"})
        assert_json_error(res, 400, "q[1] is in French (fr")
        assert engine.calls == []  # nothing refused reached the engine
        # short, mixed or the model's own language: translated as the model's source
        for text in (ENGLISH, "Hallo Welt", "Ein Hund läuft.", "Angela Merkel visits the Bundestag.", "iPhone 15 Pro Max"):
            res = client.post("/translate", json={"q": text, "source": "auto", "target": "de"})
            assert res.status_code == 200 and res.json()["translatedText"] == text.upper(), (text, res.text)
        # an explicit source is the client's word: nothing is detected
        assert client.post("/translate", json={"q": GERMAN, "source": "en", "target": "de"}).status_code == 200


def test_the_refusal_needs_enough_letters_and_confidence():
    assert detect.plainly_other(GERMAN, "en") == ("de", pytest.approx(detect.detect(GERMAN)[0][1]))
    assert detect.plainly_other(GERMAN, "de") is None and detect.plainly_other(GERMAN, "de-DE") is None
    short = "Hunde spielen im Schnee."  # 20 letters: long enough
    assert sum(ch.isalpha() for ch in short) == detect.MIN_LETTERS and detect.plainly_other(short, "en")
    shorter = "Hund spielt im Schnee."  # 18 letters: too short to refuse, however sure the identifier is
    assert detect.detect(shorter)[0][0] == "de" and detect.plainly_other(shorter, "en") is None
    unsure = "Angela Merkel visits the Bundestag."  # long enough, but the identifier is unsure
    assert detect.detect(unsure)[0][1] < detect.MIN_CONFIDENCE and detect.plainly_other(unsure, "en") is None
    assert detect.plainly_other("<p><b>Zwei Hunde</b> spielen im Schnee.</p>", "en", strip_tags=True)[0] == "de"


# -- /frontend/settings and CORS ----------------------------------------------------------------

def test_frontend_settings():
    with client_for(api_key="k") as client:
        settings = client.get("/frontend/settings").json()
    assert settings == {
        "charLimit": 200, "frontendTimeout": 300, "suggestions": False, "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html"], "apiKeys": True, "keyRequired": True,
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "de", "name": "German"}},
    }


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}


def test_no_cors_headers_by_default():
    with client_for() as client:
        res = client.post("/translate", json={"q": "x", "source": "en", "target": "de"}, headers={"Origin": "https://a.example"})
        assert res.status_code == 200 and not any(k.lower().startswith("access-control") for k in res.headers)
        res = client.options("/translate", headers={"Origin": "https://a.example", **PREFLIGHT})
        assert_json_error(res, 405)
        assert "access-control-allow-origin" not in res.headers


def test_cors_for_the_origins_given():
    with client_for(cors=["https://a.example"]) as client:
        res = client.post("/translate", json={"q": "x", "source": "en", "target": "de"}, headers={"Origin": "https://a.example"})
        assert res.headers["access-control-allow-origin"] == "https://a.example" and "Origin" in res.headers["vary"]
        assert "Server-Timing" in res.headers["access-control-expose-headers"]
        res = client.post("/translate", json={"q": ""}, headers={"Origin": "https://a.example"})  # errors too
        assert res.status_code == 400 and res.headers["access-control-allow-origin"] == "https://a.example"
        res = client.options("/translate", headers={"Origin": "https://a.example", **PREFLIGHT})
        assert res.status_code == 204 and res.headers["access-control-allow-origin"] == "https://a.example"
        assert "POST" in res.headers["access-control-allow-methods"]
        assert "content-type" in res.headers["access-control-allow-headers"].lower()
        res = client.get("/languages", headers={"Origin": "https://evil.example"})
        assert res.status_code == 200 and "access-control-allow-origin" not in res.headers
        assert_json_error(client.options("/translate", headers={"Origin": "https://evil.example", **PREFLIGHT}), 403, "evil")
        assert "access-control-allow-origin" not in client.get("/languages").headers  # no Origin: not a CORS request
    with client_for(cors=["*"]) as client:
        res = client.get("/languages", headers={"Origin": "https://anyone.example"})
        assert res.headers["access-control-allow-origin"] == "*"


def test_cors_origins_are_checked():
    with pytest.raises(ValueError, match="https://example.org"):
        create_app(FakeEngine(), cors=["example.org"])


# -- files --------------------------------------------------------------------------------------

def upload(client, name: str, data: bytes, **fields):
    fields = {"source": "en", "target": "de", **fields}
    return client.post("/translate_file", files={"file": (name, data)}, data=fields)


def test_translate_a_text_file_and_download_it_once():
    engine = FakeEngine()
    text = "A dog runs.\r\n\r\nTwo cats sleep.\nA man reads.\nA bird sings.\n  \nLast line, no ending"
    with client_for(engine) as client:
        res = upload(client, "notes.txt", text.encode())
        assert res.status_code == 200, res.text
        url = res.json()["translatedFileUrl"]
        assert url.startswith("http://testserver/download_file/") and url.endswith(".txt")
        got = client.get(url)
        assert got.status_code == 200 and got.headers["content-type"] == "text/plain; charset=utf-8"
        assert got.headers["content-disposition"] == 'attachment; filename="notes.de.txt"'
        # line by line, blank lines and line endings kept
        assert got.content.decode() == "A DOG RUNS.\r\n\r\nTWO CATS SLEEP.\nA MAN READS.\nA BIRD SINGS.\n  \nLAST LINE, NO ENDING"
        assert [len(texts) for texts in engine.calls] == [3, 2]  # max_texts lines per call
        assert_json_error(client.get(url), 404, "no such file")  # removed after its download
        assert len(client.app.state.files) == 0
        bom = upload(client, "bom.txt", b"\xef\xbb\xbfhello\n").json()["translatedFileUrl"]
        assert client.get(bom).content == b"\xef\xbb\xbfHELLO\n"
        named = client.get(upload(client, "Bericht über Hunde.txt", b"x\n").json()["translatedFileUrl"])
        assert named.headers["content-disposition"] == (  # an ASCII name for old clients, the name itself for the rest
            "attachment; filename=\"Bericht__ber_Hunde.de.txt\"; filename*=UTF-8''Bericht_%C3%BCber_Hunde.de.txt")


def test_an_html_file_is_translated_as_html():
    from text_fakes import FakeEngine as TextEngine

    from xformer_cli.serve.engine import ServedModel

    page = b"<html><head><script>var a = 1;</script></head><body>\n<p>A <b>dog</b> runs.</p>\n<pre>keep me</pre></body></html>\n"
    with client_for(ServedModel(TextEngine(), "fake", "xformer", "fp32", "en", "de", 4)) as client:
        res = upload(client, "page.html", page)
        assert res.status_code == 200, res.text
        got = client.get(res.json()["translatedFileUrl"])
        assert got.status_code == 200 and got.headers["content-type"] == "text/html; charset=utf-8"
        assert got.headers["content-disposition"] == 'attachment; filename="page.de.html"'
        # the text translated, tags, script and code kept
        assert got.content == page.replace(b"A <b>dog</b> runs.", b"A <b>DOG</b> RUNS.")


def test_a_long_html_file_is_translated_in_pieces_that_take_turns():
    """Cut between blocks, never inside <pre> or <script>: each piece one engine call (other clients'
    requests go between them), the page as the whole would have come out."""
    from text_fakes import FakeEngine as TextEngine

    from xformer_cli.serve.engine import ServedModel

    rows = "".join(f"<p>Dog {i} runs <i>fast</i>.</p>\n" for i in range(40))
    page = f"<html><body>\n{rows}<pre>keep <p>this</p> as it is</pre><script>var p = '<p>x</p>';</script>" \
           f"<p>Last.</p>\n</body></html>\n"
    engine = TextEngine()
    with client_for(ServedModel(engine, "fake", "xformer", "fp32", "en", "de", 4)) as client:  # max_chars 200
        got = client.get(upload(client, "page.html", page.encode()).json()["translatedFileUrl"])
    expected = page
    for i in range(40):
        expected = expected.replace(f"<p>Dog {i} runs <i>fast</i>.</p>", f"<p>DOG {i} RUNS <i>FAST</i>.</p>")
    assert got.content.decode() == expected.replace("<p>Last.</p>", "<p>LAST.</p>")
    assert len(engine.calls) == 7 and max(len(call) for call in engine.calls) <= 7  # ~200 characters a piece
    assert all("keep" not in line and "x" not in line for call in engine.calls for line in call)


def test_an_html_file_that_ends_inside_thousands_of_open_tags_is_answered_at_once():
    """html.parser before CPython's fix walks an unfinished tail a character at a time (quadratic): a
    small upload held the engine for minutes. Markup the input ends inside is kept as it is."""
    from text_fakes import FakeEngine as TextEngine

    from xformer_cli.serve.engine import ServedModel

    page = b"<p>A dog.</p>" + b"<a " * 100_000  # 300 kB; quadratically, hours
    model = ServedModel(TextEngine(), "fake", "xformer", "fp32", "en", "de", 4)
    with client_for(model, max_file_bytes=1 << 20) as client:
        got = client.get(upload(client, "evil.html", page).json()["translatedFileUrl"])
    assert got.content == b"<p>A DOG.</p>" + b"<a " * 100_000


@pytest.mark.parametrize("name, data, status, fragment", [
    ("photo.txt", b"GIF89a\x00\x01\x02", 400, "binary"),
    ("latin1.txt", "café".encode("latin-1"), 400, "not UTF-8"),
    ("report.pdf", b"%PDF-1.4", 400, "not a supported file"),
    ("noext", b"hello", 400, "not a supported file"),
    ("big.txt", b"word " * 300, 413, "at most 1000"),
    ("empty.txt", b"\n\n", 400, "no text"),
    ("long.txt", b"x" * 201, 400, "line 1 of the file has 201 characters"),
])
def test_bad_files_get_a_json_4xx(name, data, status, fragment):
    engine = FakeEngine()
    with client_for(engine, max_file_bytes=1000) as client:
        assert_json_error(upload(client, name, data), status, fragment)
        assert engine.calls == []


def test_file_requests_check_the_form_the_languages_and_the_key():
    with client_for(api_key="k", max_file_bytes=1000) as client:
        assert_json_error(upload(client, "a.txt", b"hi"), 403)
        assert_json_error(upload(client, "a.txt", b"hi", api_key="k", target="fr"), 400, "en->de")
        assert upload(client, "a.txt", b"hi", api_key="k").status_code == 200
        assert_json_error(client.post("/translate_file", data={"source": "en", "api_key": "k"}), 400, "missing file")
        assert_json_error(client.post("/translate_file", json={"q": "x"}), 400, "multipart")
        res = client.post("/translate_file", content=b"x" * 70_000, headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert_json_error(res, 413)


def test_the_file_store_is_bounded_and_forgets():
    now = [0.0]
    store = FileStore(ttl=60, max_files=2, max_bytes=10, clock=lambda: now[0])
    first = store.put(b"12345", "a.de.txt", ".txt")
    store.put(b"678", "b.de.txt", ".txt")
    with pytest.raises(ApiError) as full:
        store.put(b"9", "c.de.txt", ".txt")  # two files wait already
    assert full.value.status == 503
    assert store.take(first) == (b"12345", "a.de.txt") and len(store) == 1
    with pytest.raises(ApiError) as too_big:
        store.put(b"123456789", "d.de.txt", ".txt")  # 3 + 9 bytes > 10
    assert too_big.value.status == 503
    folder = store._dir
    now[0] = 61  # expired: gone from the store and from the disk
    assert len(list(folder.iterdir())) == 1 and store.put(b"x", "e.de.txt", ".txt") and len(store) == 1
    assert len(list(folder.iterdir())) == 1
    store.close()
    assert not folder.exists()


def test_split_lines_gives_the_text_back():
    for text in ("", "a", "a\n", "a\r\nb\rc\n\n", "\n\nx", "a\fb\u2028c\x85d\n"):
        lines, endings = split_lines(text)
        assert "".join(line + end for line, end in zip(lines, endings)) == text
    # a form feed or a Unicode line separator stays inside its line, as POST /translate keeps it
    assert split_lines("A dog.\fA cat.\u2028A bird.\r\nEnd") == (["A dog.\fA cat.\u2028A bird.", "End"], ["\r\n", ""])


# -- hostile clients ----------------------------------------------------------------------------

def test_deeply_nested_json_is_a_400_json():
    nested = b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b', "source": "en", "target": "de"}'
    with client_for(limits=Limits(max_body=1 << 20)) as client:
        for path in ("/translate", "/detect"):
            res = client.post(path, content=nested, headers={"Content-Type": "application/json"})
            assert_json_error(res, 400, "nested too deeply")
        assert client.post("/translate", json={"q": "alive", "source": "en", "target": "de"}).status_code == 200


def test_a_request_cancelled_by_the_shutdowns_timeout_is_a_json_503_not_a_traceback():
    """uvicorn cancels what is still running when --graceful-timeout runs out (a stalled client):
    the answer is JSON too, and the cancellation ends there."""
    import asyncio

    from xformer_cli.serve.app import Unexpected

    async def stalled(scope, receive, send):
        raise asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded")

    sent, said = [], []

    async def send(message):
        sent.append(message)

    asyncio.run(Unexpected(stalled, said.append)({"type": "http", "method": "POST", "path": "/translate"}, None, send))
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"]) == {"error": "the server is shutting down; try again"}
    assert len(said) == 1 and "503" in said[0]


def test_fields_in_the_query_string_must_be_utf8_and_a_multipart_form_holds_every_text():
    with client_for(limits=Limits(max_texts=40)) as client:
        res = client.post("/translate?q=%FF&source=en&target=de")
        assert_json_error(res, 400, "the query string is not UTF-8")
        assert client.post("/translate?q=caf%C3%A9&source=en&target=de").json() == {"translatedText": "CAFÉ"}
        texts = [("q", f"dog {i}") for i in range(30)] + [("source", "en"), ("target", "de")]
        res = client.post("/translate", files=[(k, (None, v)) for k, v in texts])  # multipart: FormData's shape
        assert res.status_code == 200 and len(res.json()["translatedText"]) == 30, res.text


def test_a_multipart_field_not_utf8_is_a_400_and_json_is_json_under_any_content_type():
    """starlette read a multipart field's bytes that are not UTF-8 as latin-1 (translated: 200),
    and a JSON body sent as multipart/form-data was 'Missing boundary'."""
    body = (b'--xx\r\nContent-Disposition: form-data; name="q"\r\n\r\nA \xff dog.\r\n'
            b'--xx\r\nContent-Disposition: form-data; name="source"\r\n\r\nen\r\n'
            b'--xx\r\nContent-Disposition: form-data; name="target"\r\n\r\nde\r\n--xx--\r\n')
    engine = FakeEngine()
    with client_for(engine) as client:
        res = client.post("/translate", content=body, headers={"content-type": "multipart/form-data; boundary=xx"})
        assert_json_error(res, 400, "the form field 'q' is not UTF-8")
        res = client.post("/translate", content=body.replace(b"\xff", "ä".encode()),
                          headers={"content-type": "multipart/form-data; boundary=xx"})
        assert res.json() == {"translatedText": "A Ä DOG."}  # UTF-8 beyond ASCII is read as it is
        res = client.post("/translate", content=b'{"q": "A dog.", "source": "en", "target": "de"}',
                          headers={"content-type": "multipart/form-data"})
        assert res.json() == {"translatedText": "A DOG."}
        assert engine.calls == [["A ä dog."], ["A dog."]]


def test_a_text_file_in_another_language_names_the_files_line():
    """Lines go to the engine in chunks of max_texts: the refusal named q[i] of a chunk."""
    lines = [ENGLISH] * 4 + [GERMAN] + [ENGLISH]
    with client_for() as client:
        res = client.post("/translate_file", files={"file": ("mixed.txt", "\n".join(lines).encode())},
                          data={"source": "auto", "target": "de"})
        assert_json_error(res, 400, "Invalid request: line 5 of the file is in German (de")


def test_an_unexpected_exception_is_a_json_500():
    app = create_app(FakeEngine())

    @app.get("/boom")
    async def boom():
        raise KeyError("a bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        assert_json_error(client.get("/boom"), 500, "internal error (KeyError)")


def get_json(url: str, body=None, timeout: float = 10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as res:
        return json.loads(res.read())


def raw_post(port: int, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    return sock


def test_vanished_clients_cost_no_translation():
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    app = create_app(engine, batcher=dict(max_wait=0.0), limits=Limits(max_chars=2000))
    words = " ".join(["word"] * 100)
    with real_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        honest = raw_post(port, {"q": "held", "source": "en", "target": "de"})  # the engine blocks on it
        honest.settimeout(10)
        assert engine.entered.wait(5)
        waiting = [raw_post(port, {"q": f"{i} {words}", "source": "en", "target": "de"}) for i in range(10)]
        deadline = time.monotonic() + 10
        while get_json(url + "/health")["queued"] < 10:  # all ten wait in the queue
            assert time.monotonic() < deadline, get_json(url + "/health")
            time.sleep(0.02)
        for sock in waiting:  # and their clients leave
            sock.close()
        for i in range(10, 20):  # ten more send and leave at once
            raw_post(port, {"q": f"{i} {words}", "source": "en", "target": "de"}).close()
        while (health := get_json(url + "/health"))["queued"] or health["dropped"] < 10:
            assert time.monotonic() < deadline, health
            time.sleep(0.02)
        gate.set()
        answer = b""
        while not answer.endswith(b"}"):
            answer += honest.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'{"translatedText":"HELD"}')
        honest.close()
        assert get_json(url + "/translate", {"q": "next", "source": "en", "target": "de"}) == {"translatedText": "NEXT"}
        assert engine.calls == [["held"], ["next"]]  # nobody's text was translated for nobody
        assert get_json(url + "/health")["queued"] == 0


class SlowEngine(FakeEngine):
    """Decodes "slow" in 1000 steps of 10 ms, asking before each whether it is still wanted."""

    stopped_at = None

    def translate(self, texts, beam_size=None, wanted=None, **options):
        self.calls.append(list(texts))
        self.entered.set()
        for step in range(1000 if "slow" in texts else 0):
            if not wanted(texts.index("slow")):
                self.stopped_at = step
                return ["" for _ in texts]
            time.sleep(0.01)
        return [text.upper() for text in texts]


def test_a_client_that_leaves_during_its_translation_stops_the_engine():
    engine = SlowEngine()
    with real_server(create_app(engine, batcher=dict(max_wait=0.0))) as url:
        sock = raw_post(int(url.rsplit(":", 1)[1]), {"q": "slow", "source": "en", "target": "de"})
        assert engine.entered.wait(5)
        sock.close()
        deadline = time.monotonic() + 5
        while get_json(url + "/health")["abandoned"] < 1:
            assert time.monotonic() < deadline, get_json(url + "/health")
            time.sleep(0.02)
        assert get_json(url + "/translate", {"q": "next", "source": "en", "target": "de"}) == {"translatedText": "NEXT"}
        assert engine.stopped_at is not None and engine.stopped_at < 500  # not decoded to the end for nobody
        assert engine.calls == [["slow"], ["next"]] and get_json(url + "/health")["dropped"] == 0


# -- clients written for LibreTranslate ---------------------------------------------------------

def test_libretranslate_py_and_deep_translator_work_unchanged():
    httpx = pytest.importorskip("httpx")
    with real_server(create_app(FakeEngine())) as url:
        base = url + "/"
        # libretranslate-py: LibreTranslateAPI.translate / detect / languages, urllib with a form body
        form = urllib.parse.urlencode({"q": "A dog runs.", "source": "en", "target": "de"}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "translate", data=form)) as res:
            assert json.loads(res.read())["translatedText"] == "A DOG RUNS."
        with urllib.request.urlopen(urllib.request.Request(base + "detect", data=urllib.parse.urlencode({"q": GERMAN}).encode())) as res:
            assert json.loads(res.read())[0]["language"] == "de"
        with urllib.request.urlopen(urllib.request.Request(base + "languages", data=b"", method="GET")) as res:
            assert json.loads(res.read())[0] == {"code": "en", "name": "English", "targets": ["de"]}
        # deep-translator's LibreTranslator: requests.post(url, params=...) - the fields in the query string
        params = {"q": "Two cats.", "source": "auto", "target": "de", "format": "text"}
        res = httpx.post(base + "translate", params=params)
        assert res.status_code == 200 and res.json()["translatedText"] == "TWO CATS."
        assert res.json()["detectedLanguage"]["language"] == "en"
        res = httpx.post(base + "translate", params={**params, "source": "en", "target": "fr"})
        assert res.status_code == 400  # deep-translator raises on any status but 200
        # the JSON shape most other clients post
        assert httpx.post(base + "translate", json={"q": ["a", "b"], "source": "en", "target": "de", "format": "text",
                                                    "api_key": ""}).json() == {"translatedText": ["A", "B"]}


@pytest.mark.slow
@pytest.mark.slow
def test_serve_option_errors_are_one_line(tmp_path):
    from helpers import assert_one_line_error, xformer

    assert_one_line_error(xformer("serve", "-m", tmp_path / "m.pt", "--cors", "example.org"), "--cors 'example.org'")
    assert_one_line_error(xformer("serve", "-m", tmp_path / "m.pt", "--max-file-bytes", "0"), "--max-file-bytes")
    # 99999 would be taken modulo 65536 by the socket: the server would listen on 34463
    assert_one_line_error(xformer("serve", "-m", tmp_path / "m.pt", "--port", "99999"), "--port must be 0 to 65535")
    assert_one_line_error(xformer("serve", "-m", tmp_path / "m.pt", "--graceful-timeout", "-1"), "--graceful-timeout")


def test_the_python_api_checks_the_servers_settings_before_it_loads_anything(tmp_path):
    """serve() itself refuses what the CLI would (the model path does not exist: a check that
    ran after loading would fail on it instead)."""
    from xformer_cli.errors import XformerError
    from xformer_cli.serve.protocol import Limits
    from xformer_cli.serve.server import serve

    missing = str(tmp_path / "none.pt")
    for settings, message in ((dict(port=99999), "--port must be 0 to 65535, not 99999"),
                              (dict(graceful_timeout=-1.0), "--graceful-timeout must be 0 or more"),
                              (dict(limits=Limits(max_chars=0)), "must be at least 1"),
                              (dict(batcher=dict(max_wait=-0.5)), "--max-wait-ms at least 0"),
                              (dict(batcher=dict(max_wait=float("inf"))), "--max-wait-ms must be at most 10000"),
                              (dict(batcher=dict(max_wait=float("nan"))), "--max-wait-ms must be at most 10000"),
                              (dict(graceful_timeout=float("nan")), "--graceful-timeout must be 0 or more"),
                              (dict(limits=Limits(max_texts=9), batcher=dict(max_queued=4)),
                               r"--max-texts \(9\) cannot exceed --max-queue \(4\)"),
                              (dict(max_file_bytes=0), "--max-file-bytes must be at least 1"),
                              (dict(cors=["example.org"]), "--cors 'example.org'")):
        with pytest.raises(XformerError, match=message):
            serve(missing, **settings)

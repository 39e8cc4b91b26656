"""``xformer translate`` on real text, end to end with a trained checkpoint: paragraphs, HTML,
glossaries."""

import re
from html.parser import HTMLParser

import pytest

from helpers import assert_one_line_error, xformer

FAST = ("-b", "1", "--max-len-a", "0", "--max-len-b", "12")
SENTENCES = [["A dog runs on the grass.", "Two men play soccer.", "A woman sings!"],
             ["A girl in a red shirt jumps.", "The boy is eating."],
             ["People walk down the street."]]


def translate(trained_run, stdin: str, *args: str) -> list[str]:
    proc = xformer("translate", "-m", trained_run / "best.pt", *FAST, *args, stdin=stdin.encode())
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.endswith("\n")
    return out[:-1].split("\n")


@pytest.mark.slow
def test_a_paragraph_file_keeps_its_lines_and_every_sentence(trained_run):
    paragraphs = translate(trained_run, "".join(" ".join(line) + "\n" for line in SENTENCES))
    flat = [sentence for line in SENTENCES for sentence in line]
    one_per_line = translate(trained_run, "".join(s + "\n" for s in flat), "--no-split-sentences")
    assert len(paragraphs) == len(SENTENCES) and len(one_per_line) == len(flat)
    assert all(one_per_line), one_per_line
    # Every output line is its sentences' translations, each as it comes out one per line.
    at = 0
    for line, sentences in zip(paragraphs, SENTENCES):
        assert line == " ".join(one_per_line[at:at + len(sentences)]), (line, one_per_line)
        at += len(sentences)
    whole = translate(trained_run, "".join(" ".join(line) + "\n" for line in SENTENCES), "--no-split-sentences")
    assert len(whole) == len(SENTENCES) and whole != paragraphs  # the option does turn splitting off


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tags.append(("end", tag))


def tags_of(page: str) -> list:
    parser = _Tags()
    parser.feed(page)
    parser.close()
    return parser.tags


@pytest.mark.slow
def test_html_keeps_every_tag(trained_run):
    page = ('<h1>A day at the beach</h1>',
            '<p>The <b>big</b> dog runs to <a href="/w?a=1&amp;b=2">the water</a> &amp; swims.</p>',
            '<ul><li>A man sits.</li><li>Two <i>girls</i> play.</li></ul>',
            '<script>var s = "<b>not text</b>";</script><pre><code>print("keep me")</code></pre>')
    out = translate(trained_run, "\n".join(page) + "\n", "--format", "html")
    assert len(out) == len(page)
    for source, translated in zip(page, out):
        assert tags_of(translated) == tags_of(source), (source, translated)
    assert '<script>var s = "<b>not text</b>";</script><pre><code>print("keep me")</code></pre>' in out[3]
    assert 'href="/w?a=1&amp;b=2"' in out[1]
    assert "A day at the beach" not in out[0]


@pytest.mark.slow
def test_glossary_terms_appear_and_bad_lines_are_named(trained_run, tmp_path):
    terms = tmp_path / "terms.tsv"
    terms.write_text("# forced and kept\ndog\tKöter\nAcme\tAcme\n", encoding="utf-8")
    lines = ["A dog runs.", "Two men play with a dog and an Acme ball.", "A woman sings.", "Call 555-0199 at 3 pm."]
    out = translate(trained_run, "".join(line + "\n" for line in lines), "--glossary", str(terms))
    assert len(out) == len(lines)
    assert "Köter" in out[0] and "Köter" in out[1] and "Acme" in out[1], out
    assert "Köter" not in out[2] and re.search(r"\b555\b", out[3]) and re.search(r"\b3\b", out[3]), out

    terms.write_text("dog\tKöter\n\n# fine\ncat Katze\n", encoding="utf-8")  # a space, not a tab
    proc = xformer("translate", "-m", trained_run / "best.pt", "--glossary", terms, stdin=b"A dog.\n")
    assert_one_line_error(proc, f"{terms}:4")

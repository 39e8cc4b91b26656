"""HTML: markup kept byte for byte, text translated, inline tags around the right words."""

from html.parser import HTMLParser

from text_fakes import FakeEngine

from xformer_cli.text import TextOptions, translate_texts
from xformer_cli.text.html import parse_html, tokenize

PAGE = """<!DOCTYPE html>
<html><head><title>Tom &amp; Jerry</title><style>p { color: red; }</style></head>
<body>
<h1>A day at the beach</h1>
<p>The <b>big</b> dog runs to the water. See <a href="/x?a=1&amp;b=2">this page</a> for more &copy; us.</p>
<ul><li>First item</li><li>Second <i>item</i></li></ul>
<script>var s = "<b>not text</b>";</script>
<pre><code>print("keep me")</code></pre>
<!-- a comment -->
</body></html>"""


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.data = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tags.append(("end", tag))


def tags_of(text):
    parser = Tags()
    parser.feed(text)
    parser.close()
    return parser.tags


def test_tokens_join_to_the_source_even_when_broken():
    for source in (PAGE, "<p>broken <b>bold", "a < b & c <<>>", "<div><p>x</div", "&", "<"):
        assert "".join(token.raw for token in tokenize(source)) == source


def test_identity_translation_gives_the_page_back():
    out = translate_texts(FakeEngine(lambda text: text), [PAGE], TextOptions(format="html"))[0].text
    assert out == PAGE


def test_text_is_translated_and_markup_is_kept():
    out = translate_texts(FakeEngine(), [PAGE], TextOptions(format="html"))[0].text
    assert tags_of(out) == tags_of(PAGE)
    assert "<title>TOM &amp; JERRY</title>" in out and "<h1>A DAY AT THE BEACH</h1>" in out
    assert '<script>var s = "<b>not text</b>";</script>' in out and '<code>print("keep me")</code>' in out
    assert "<style>p { color: red; }</style>" in out and "<!-- a comment -->" in out
    assert 'THE <b>BIG</b> DOG RUNS TO THE WATER. SEE <a href="/x?a=1&amp;b=2">THIS PAGE</a> FOR MORE &copy; US.' in out


def test_inline_tags_follow_their_words_when_the_translation_reorders():
    swap = lambda text: " ".join(reversed(text.split()))  # noqa: E731
    out = translate_texts(FakeEngine(swap), ["<p>one two <b>three</b></p>"], TextOptions(format="html"))[0].text
    assert tags_of(out) == tags_of("<p>one two <b>three</b></p>") and out.startswith("<p>")


def test_a_closing_tag_stays_before_the_sentence_punctuation_its_source_has_outside():
    german = {"A man with 2 dogs.": "Ein Mann mit 2 Hunden.", "He said stop": 'Er sagte „halt“',
              "A dog runs.": "Ein Hund läuft."}
    engine = FakeEngine(lambda text: german[text])
    out = translate_texts(engine, ["<p>A man with <b>2 dogs</b>.</p>"], TextOptions(format="html"))[0].text
    assert out == "<p>Ein Mann mit <b>2 Hunden</b>.</p>", out
    # Punctuation the source has inside the tag stays inside; an opening quote stays outside a start.
    out = translate_texts(engine, ["<p><i>A dog runs.</i></p>"], TextOptions(format="html"))[0].text
    assert out == "<p><i>Ein Hund läuft.</i></p>", out
    out = translate_texts(engine, ["<p>He said <i>stop</i></p>"], TextOptions(format="html"))[0].text
    assert out == "<p>Er sagte „<i>halt</i>“</p>", out


def test_attention_alignment_keeps_edge_punctuation_outside_too():
    import torch

    from xformer_cli.text.align import AttentionAligner

    pieces = ["▁Ein", "▁Mann", "▁mit", "▁2", "▁Hunden", "."]
    matrix = torch.zeros(len(pieces), 6)
    for target_piece, source_piece in enumerate([0, 1, 2, 3, 4, 5]):
        matrix[target_piece, source_piece] = 1.0
    source_pieces = ["▁A", "▁man", "▁with", "▁2", "▁dogs", "."]
    aligner = AttentionAligner(lambda source, tokens: matrix, lambda s: source_pieces, lambda t: pieces)
    target = "Ein Mann mit 2 Hunden."
    start, end = aligner("A man with 2 dogs.", target, list(range(len(pieces))), [(11, "start"), (17, "end")])
    assert target[start:end] == "2 Hunden", (start, end)
    (whole,) = aligner("A man with 2 dogs.", target, list(range(len(pieces))), [(18, "end")])
    assert whole == len(target)  # the source's own full stop inside: the target's stays inside


def test_broken_html_never_crashes_and_keeps_every_tag():
    for source in ("<p>broken <b>bold", "<div><p>x</div", "<<b>>", "<p class='a>text</p>", "</b>stray"):
        out = translate_texts(FakeEngine(), [source], TextOptions(format="html"))[0].text
        assert [t.raw for t in tokenize(out) if t.kind != "text"] == [t.raw for t in tokenize(source) if t.kind != "text"]


def test_markup_the_input_ends_inside_is_kept_and_not_translated():
    """A browser shows nothing of an unclosed comment, CDATA, tag or processing instruction."""
    for tail in ("<!-- secret note", '<a href="/x', "<![CDATA[ y", "<?php echo 1", "<!DOCTYPE"):
        source = f"<p>Hi there.</p> More text {tail}"
        out = translate_texts(FakeEngine(), [source], TextOptions(format="html"))[0].text
        assert out == f"<p>HI THERE.</p> MORE TEXT {tail}", out
    out = translate_texts(FakeEngine(), ["3 < 4 and b"], TextOptions(format="html"))[0].text
    assert out == "3 &lt; 4 AND B"  # a lone < is text (escaped on the way out)


def test_blocks_split_at_block_tags():
    document = parse_html("<ul><li>One</li><li>Two <b>x</b></li></ul>")
    assert [segment.text for segment in document.segments] == ["One", "Two x"]

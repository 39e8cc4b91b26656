"""Paragraphs split into sentences, translated in one engine call, joined whitespace-exact;
long sentences cut with no text lost."""

from text_fakes import FakeEngine

from xformer_cli.text import TextOptions, translate_texts
from xformer_cli.text.long import cut_sentence
from xformer_cli.text.sentences import split_spans


def test_spans_cover_the_text_exactly():
    text = "  Hello Mr. Smith.  How are you?\tFine!  "
    spans = split_spans(text, "en")
    assert "".join(text[s.start:s.end] for s in spans) == text
    assert [text[s.start:s.end] for s in spans if not s.is_gap] == ["Hello Mr. Smith.", "How are you?", "Fine!"]
    assert [text[s.start:s.end] for s in split_spans(text, "en", enabled=False) if not s.is_gap] == [text.strip()]


def test_a_paragraph_is_one_engine_call_and_keeps_its_whitespace():
    engine = FakeEngine()
    out = translate_texts(engine, ["One dog runs.  Two cats sleep.\tThe end!", "", "Alone here."], TextOptions())
    assert [r.text for r in out] == ["ONE DOG RUNS.  TWO CATS SLEEP.\tTHE END!", "", "ALONE HERE."]
    assert engine.calls == [["One dog runs.", "Two cats sleep.", "The end!", "Alone here."]]


def test_splitting_can_be_turned_off():
    engine = FakeEngine()
    out = translate_texts(engine, ["One dog runs.  Two cats sleep."], TextOptions(split_sentences=False))
    assert out[0].text == "ONE DOG RUNS. TWO CATS SLEEP." and engine.calls == [["One dog runs. Two cats sleep."]]


def test_alternatives_join_each_sentences_kth_hypothesis():
    out = translate_texts(FakeEngine(), ["A dog. A cat."], TextOptions(alternatives=2))
    assert out[0].text == "A DOG. A CAT."
    assert out[0].alternatives == ["A DOG. ~1 A CAT. ~1", "A DOG. ~2 A CAT. ~2"]


def test_a_long_sentence_is_cut_at_clauses_and_nothing_is_lost():
    words = lambda text: len(text.split())  # noqa: E731
    sentence = ", ".join(f"clause {i} has five words" for i in range(40)) + "."
    parts = cut_sentence(sentence, words, 12)
    assert all(words(part) <= 12 for part in parts) and len(parts) > 1
    assert " ".join(parts) == sentence
    assert all(part.endswith((",", ".")) for part in parts)  # cut after the commas
    engine = FakeEngine(max_input_len=12)
    out = translate_texts(engine, [sentence], TextOptions())
    assert out[0].text == sentence.upper() and len(engine.calls[0]) == len(parts)


def test_a_clause_without_punctuation_is_cut_into_windows_and_a_giant_token_stays_whole():
    words = lambda text: len(text.split())  # noqa: E731
    sentence = " ".join(f"w{i}" for i in range(50))
    parts = cut_sentence(sentence, words, 8)
    assert " ".join(parts) == sentence and max(map(words, parts)) <= 8
    giant = "x" * 3000
    assert cut_sentence(giant, lambda text: len(text), 128) == [giant]  # the engine cuts it, with its warning


def test_each_sentence_maps_to_its_translation():
    text = "  One dog runs.  Two cats sleep.\tThree birds sing."
    result = translate_texts(FakeEngine(), [text], TextOptions())[0]
    pairs = [(text[a:b], result.text[c:d]) for a, b, c, d in result.sentences]
    assert pairs == [("One dog runs.", "ONE DOG RUNS."), ("Two cats sleep.", "TWO CATS SLEEP."),
                     ("Three birds sing.", "THREE BIRDS SING.")]


def test_a_long_sentence_is_cut_at_every_clause_not_packed_up_to_the_limit():
    words = lambda text: len(text.split())  # noqa: E731
    sentence = ", ".join(f"clause {i} has five words" for i in range(40)) + "."
    parts = cut_sentence(sentence, words, 64)  # 64 // 8: clauses of five words are not packed
    assert len(parts) == 40 and " ".join(parts) == sentence
    short = ", ".join(f"c{i} two" for i in range(60))  # two-word clauses: packed up to 80 // 8 words
    assert all(words(part) <= 10 for part in cut_sentence(short, words, 80)) and len(cut_sentence(short, words, 80)) < 60

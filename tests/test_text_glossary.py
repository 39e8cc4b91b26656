"""Glossaries: terms forced, do-not-translate kept, file errors named."""

import pytest

from helpers import assert_one_line_error, xformer
from text_fakes import FakeEngine

from xformer_cli.errors import XformerError
from xformer_cli.text import Glossary, TextOptions, load_glossary, translate_texts
from xformer_cli.text.glossary import mask_terms, restore_terms


def test_placeholders_mask_and_restore():
    masked = mask_terms("Use Firefox at https://x.org/a, 3 times.", Glossary.from_dict({"Firefox": "Firefox"}))
    assert masked.text == "Use X1 at X2, X3 times." and masked.targets == ["Firefox", "https://x.org/a", "3"]
    assert restore_terms("Nimm X1 bei X2, X3 mal.", masked, {})[0] == "Nimm Firefox bei https://x.org/a, 3 mal."
    text, _ = restore_terms("Nimm bei X2 mal.", masked, {0: 0, 2: 5})
    assert "Firefox" in text and "3" in text and "https://x.org/a" in text


@pytest.mark.parametrize("placeholders", [True, False])
def test_every_forced_term_appears(placeholders):
    lose = lambda text: text.replace("dog", "Hund").replace("X1", "").replace("X2", "")  # noqa: E731
    glossary = Glossary.from_dict({"dog": "Köter", "Acme": "Acme"})
    out = translate_texts(FakeEngine(lose), ["The dog of Acme runs.", "No terms here."],
                          TextOptions(glossary=glossary, placeholders=placeholders))
    assert "Köter" in out[0].text and "Acme" in out[0].text and out[1].text == "No terms here."


def test_glossary_file(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("# comment\ndog\tHund\n\nAcme\tAcme\n", encoding="utf-8")
    assert load_glossary(path).terms == {"dog": "Hund", "Acme": "Acme"}
    path.write_text("dog\tHund\ncat\n", encoding="utf-8")
    with pytest.raises(XformerError, match=r"terms\.tsv:2: a glossary line needs"):
        load_glossary(path)
    path.write_text("dog\tHund\ncat\tKatze\ndog\tHund\n", encoding="utf-8")  # the same pair twice: harmless
    assert load_glossary(path).terms == {"dog": "Hund", "cat": "Katze"}
    path.write_text("dog\tHund\ncat\tKatze\ndog\tKöter\n", encoding="utf-8")  # the last one won, unsaid
    with pytest.raises(XformerError, match=r"terms\.tsv:3: 'dog' is given another target term than on line 1 "
                                           r"\('Hund' there, 'Köter' here\)"):
        load_glossary(path)


@pytest.mark.slow
def test_glossary_file_error_through_the_cli(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("dog\tHund\ncat\n", encoding="utf-8")
    result = xformer("translate", "-m", tmp_path / "missing.pt", "--glossary", path, stdin=b"A dog.\n")
    assert_one_line_error(result, f"{path}:2")


def test_aligned_replacement_covers_whole_words_only():
    masked = mask_terms("The dog runs.", Glossary.from_dict({"dog": "Köter"}), placeholders=False)
    # An alignment that lands inside words ("Hu|nd", "läu|ft") still replaces whole words.
    assert restore_terms("Der Hund läuft.", masked, {0: (6, 11)})[0] == "Der Köter."
    assert restore_terms("Der Hund läuft.", masked, {0: (5, 7)})[0] == "Der Köter läuft."
    # Punctuation at the edges of the replaced words stays.
    assert restore_terms("Der Hund.", masked, {0: (4, 9)})[0] == "Der Köter."
    # An empty span inside a word: the term is inserted before that word, not inside it.
    assert restore_terms("Der Hund läuft.", masked, {0: (6, 6)})[0] == "Der Köter Hund läuft."


def test_attention_alignment_lands_on_words_of_the_detokenized_text():
    import torch

    from xformer_cli.text.align import AttentionAligner

    # The pieces decode to a different length than they spell ("<unk>" -> " ⁇ "): offsets
    # counted on the pieces would fall inside words of the real text.
    pieces = ["▁Ein", "<unk>", "▁Hund", "e", "▁läuft", "."]
    target = "Ein ⁇ Hunde läuft."
    matrix = torch.zeros(len(pieces) + 1, 3)
    matrix[2, 1] = matrix[3, 1] = 1.0  # source piece "▁dog" -> "▁Hund" "e"
    aligner = AttentionAligner(lambda source, tokens: matrix, lambda s: ["▁The", "▁dog", "."], lambda t: pieces)
    start, end = aligner("The dog.", target, list(range(len(pieces))), [(4, "start"), (7, "end")])
    assert target[start:end] == "Hunde", (start, end)


def test_every_occurrence_of_a_term_gets_its_target():
    def two_dogs(text):
        return text.replace("dog", "Hund") if "X" not in text else text
    glossary = Glossary.from_dict({"dog": "Köter"})
    engine = FakeEngine(lambda text: two_dogs(text).replace("Hund", "Köter", 1))  # the model forced one of two
    out = translate_texts(engine, ["a dog and a dog"], TextOptions(glossary=glossary))
    assert out[0].text.count("Köter") == 2 and "Hund" not in out[0].text, out[0].text


def test_a_do_not_translate_term_the_model_dropped_replaces_its_aligned_word():
    """It was inserted before that word: "Ein Mann verwendet ein Firefox Kunststück", "Ein dog
    Hund rennt" (docs: the aligned words are replaced by the term)."""
    masked = mask_terms("A man uses Firefox on a laptop.", Glossary.from_dict({"Firefox": "Firefox"}),
                        placeholders=False)
    target = "Ein Mann verwendet ein Kunststück auf einem Laptop."
    at = target.index("Kunststück")
    assert restore_terms(target, masked, {0: (at, at + len("Kunststück"))})[0] == \
        "Ein Mann verwendet ein Firefox auf einem Laptop."


def test_a_large_glossary_compiles_each_term_once():
    """One pattern per term and sentence went through re's cache of 512: past it, every term was
    compiled again for every sentence (1000 terms: 80 ms a sentence, the server's one engine thread)."""
    from xformer_cli.text import glossary as module

    terms = {f"term{i}": f"Begriff{i}" for i in range(1000)}
    glossary = Glossary.from_dict({**terms, "dog": "Köter"})
    module._term_pattern.cache_clear()
    for sentence in ("The dog runs.", "A term7 and term700 here.", "Nothing at all.") * 3:
        masked = mask_terms(sentence, glossary, placeholders=False)
    assert masked.targets == [] and mask_terms("A term7 and term700.", glossary, placeholders=False).targets == [
        "Begriff7", "Begriff700"]
    # the terms a sentence holds as text, once each: dog, term7, term700, and term70 (in term700, not as a word)
    assert module._term_pattern.cache_info().misses == 4

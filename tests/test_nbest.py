"""``--nbest``'s rows (text/translation.py: ``result_lines``, ``nbest_rows``): one formatter for
every path, exactly K rows per input line, best first."""

import math

from xformer_cli.text import TextOptions, translate_texts
from xformer_cli.text.translation import nbest_rows, result_lines, translate_text_stream

from text_fakes import FakeEngine


class FewEngine(FakeEngine):
    """A fake engine whose search finds only ``found[word]`` hypotheses for a sentence that
    starts with ``word`` (as a tiny vocabulary or a short length limit leaves fewer than asked)."""

    def __init__(self, found: dict[str, int]):
        super().__init__()
        self.found = found

    def search(self, lines, opts, wanted=None):
        hyps = super().search(lines, opts, wanted)
        return [h[:self.found.get(line.split()[0], len(h))] if h else h for line, h in zip(lines, hyps)]


def rows(engine, lines: list[str], k: int) -> list[list[str]]:
    """What ``xformer translate --nbest k`` writes for ``lines``, split at its tabs."""
    search = engine.options(beam_size=k, nbest=k)
    results = translate_text_stream(engine, lines, TextOptions(alternatives=k - 1), search)
    return [row.split("\t") for row in result_lines(results, k)]


def test_a_rank_the_search_did_not_find_is_empty_and_scores_minus_infinity():
    """It used to repeat the best translation with the best score (an n-best list whose
    scores rose again), and the engine's own formatter wrote -inf where the pipeline's wrote
    0.0000, the score of a certain translation."""
    out = rows(FewEngine({"One": 1}), ["One dog.", "Two cats."], 3)
    assert [(r[0], r[1]) for r in out] == [(str(i), str(k)) for i in (1, 2) for k in (1, 2, 3)]
    assert out[0][3] == "ONE DOG." and float(out[0][2]) == 0.0
    assert out[1] == ["1", "2", "-inf", ""] and out[2] == ["1", "3", "-inf", ""]
    assert [r[3] for r in out[3:]] == ["TWO CATS.", "TWO CATS. ~1", "TWO CATS. ~2"]
    for line in (out[:3], out[3:]):
        scores = [float(r[2]) for r in line]
        assert scores == sorted(scores, reverse=True)


def test_a_sentence_short_of_a_rank_gives_its_best_when_another_has_it():
    out = rows(FewEngine({"One": 1}), ["One dog. Two cats."], 3)
    assert [r[3] for r in out] == ["ONE DOG. TWO CATS.", "ONE DOG. TWO CATS. ~1", "ONE DOG. TWO CATS. ~2"]
    assert [float(r[2]) for r in out] == [0.0, -1.0, -2.0]


def test_a_blank_line_gives_k_empty_rows_scored_zero():
    assert rows(FakeEngine(), ["", "A dog."], 2)[:2] == [["1", "1", "0.0000", ""], ["1", "2", "0.0000", ""]]
    assert nbest_rows(7, [], [], 2) == ["7\t1\t-inf\t", "7\t2\t-inf\t"]
    assert math.isinf(float(nbest_rows(1, ["x"], [-0.5], 2)[1].split("\t")[2]))


def test_html_lines_without_text_give_k_rows_of_their_markup_scored_zero():
    """Ranks 2..K of a markup-only line came out empty and -inf (only rank 1 was rendered)."""
    engine = FakeEngine()
    search = engine.options(beam_size=3, nbest=3)
    results = translate_text_stream(engine, ["<p>A <b>dog</b>.</p>", "", "<br>"],
                                    TextOptions(alternatives=2, format="html"), search)
    out = [row.split("\t") for row in result_lines(results, 3)]
    assert out[3:] == [["2", str(k), "0.0000", ""] for k in (1, 2, 3)] + [["3", str(k), "0.0000", "<br>"] for k in (1, 2, 3)]
    assert out[0][3] == "<p>A <b>DOG</b>.</p>"


def test_rows_keep_four_columns_and_nbest_one_asked_for_is_a_row():
    """A tab between two sentences of the source was copied into the translation (a fifth column);
    `--nbest 1` given wrote plain lines, unscored."""
    out = rows(FakeEngine(), ["A dog.\tTwo cats."], 2)
    assert [len(r) for r in out] == [4, 4] and out[0][3] == "A DOG. TWO CATS."
    engine = FakeEngine()
    results = translate_text_stream(engine, ["A dog."], TextOptions(), engine.options(beam_size=1, nbest=1))
    assert list(result_lines(results, 1, rows=True)) == ["1\t1\t0.0000\tA DOG."]


def test_alternatives_stop_where_the_search_found_fewer():
    """The server's alternatives and the Python API's: what was found, no padding, no copies."""
    engine = FewEngine({"One": 2})
    text = translate_texts(engine, ["One dog."], TextOptions(alternatives=3), engine.options(beam_size=4))[0]
    assert text.alternatives == ["ONE DOG. ~1"] and text.scores == [0.0, -1.0]
    html = translate_texts(engine, ["<p>One dog.</p>"], TextOptions(alternatives=3, format="html"),
                           engine.options(beam_size=4))[0]
    assert html.alternatives == ["<p>ONE DOG. ~1</p>"] and html.scores == [0.0, -1.0]



class SearchLog(FakeEngine):
    """A fake engine that keeps the search options of each call."""

    def __init__(self):
        super().__init__()
        self.searches = []

    def search(self, lines, opts, wanted=None):
        self.searches.append(opts)
        return super().search(lines, opts, wanted)


def test_a_search_given_keeps_its_beam_and_the_models_own_widens_for_the_alternatives():
    """A search of beam 1 asked for with alternatives was widened in silence to beam 2, which
    changed the best translation too; the model's own search (none given) widens, as serve's."""
    import pytest

    from xformer_cli.errors import XformerError

    engine = SearchLog()
    with pytest.raises(XformerError, match="alternatives 1 need a beam of at least 2: the search asked for has "
                                           "beam_size 1"):
        translate_texts(engine, ["One dog."], TextOptions(alternatives=1), engine.options(beam_size=1))
    assert engine.searches == []
    out = translate_texts(engine, ["One dog."], TextOptions(alternatives=5))
    assert out[0].alternatives[-1] == "ONE DOG. ~5" and engine.searches[-1].beam_size == 6
    translate_texts(engine, ["One dog."], TextOptions(alternatives=2))
    assert (engine.searches[-1].beam_size, engine.searches[-1].nbest) == (4, 3)  # the model's beam, wide enough


def test_sampling_with_a_seed_draws_each_chunk_of_a_stream_with_its_own_seed():
    """Every chunk was drawn with the one seed: a line repeated through a file was sampled alike
    in each chunk. Chunk k now draws with seed + k, as the pipeline's corpus translation does."""
    engine = SearchLog()
    search = engine.options(beam_size=1, sampling_topk=10, seed=5)
    list(translate_text_stream(engine, ["A dog."] * 5, TextOptions(), search, chunk_lines=2))
    assert [opts.seed for opts in engine.searches] == [5, 6, 7]
    engine.searches.clear()
    list(translate_text_stream(engine, ["A dog."] * 3, TextOptions(), engine.options(beam_size=1), chunk_lines=2))
    assert [opts.seed for opts in engine.searches] == [None, None]

"""sentencepiece is called once a line for short lists, once for the whole list for long ones
(its list calls start a thread pool each time): the same pieces and text either way."""

import random

from xformer_cli.tokenizer import ONE_CALL_FROM, Tokenizer, one_call_or_each

WORDS = "a man in a blue shirt is riding a bike down the street two dogs play with 42 balls".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def test_short_lists_go_a_line_a_call_and_long_ones_in_one_call():
    calls = []

    def call(arg):
        calls.append(arg)
        return [x * 2 for x in arg] if isinstance(arg, list) else arg * 2

    assert one_call_or_each(call, [1, 2, 3]) == [2, 4, 6] and calls == [1, 2, 3]
    calls.clear()
    long = list(range(ONE_CALL_FROM))
    assert one_call_or_each(call, long) == [x * 2 for x in long] and calls == [long]


def test_a_tokenizer_encodes_and_decodes_alike_either_way():
    text = sentences(400, seed=1)
    trained = Tokenizer.train(text, text, joint=True, vocab_size=60)
    pieces = [trained.src.id_to_piece(i) for i in range(trained.src.get_piece_size())]
    # an imported MarianMT model's kind: a vocabulary of its own over the sentencepiece model, with a target tag
    imported = Tokenizer(trained.src_model_bytes, None, pieces + [">>deu<<"])
    for tok in (trained, imported):
        for n in (1, 5, ONE_CALL_FROM - 1, ONE_CALL_FROM, 200):
            lines = sentences(n, seed=n)
            each = [tok.src.encode(line) for line in lines]
            assert tok.encode_tgt(lines) == each
            assert tok.decode_tgt(each) == [tok.tgt.decode(ids) for ids in each] == lines
            assert tok.decode_tgt([[]] + each[:1]) == ["", lines[0]]  # an empty hypothesis is an empty line
            tagged = [f">>deu<< {line}" if tok is imported else line for line in lines]
            assert tok.encode_src(tagged) == [([len(pieces)] if tok is imported else []) + ids for ids in each]

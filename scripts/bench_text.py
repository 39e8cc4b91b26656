"""Real text against plain sentences, on one engine in one run: paragraphs, a long sentence,
glossaries and HTML (issue 22's checks). Prints the figures.

    python scripts/bench_text.py --checkpoint runs/multi30k/best.pt
    python scripts/bench_text.py --checkpoint runs/multi30k/best.pt --only paragraphs \\
        --paragraph-set wmt14 --lines 600

- paragraphs: a test set joined into paragraphs of 5 lines. Every source sentence must get a
  non-empty translation and the output line as many sentence ends as the five sentence-file
  translations; BLEU after re-splitting (each paragraph's per-sentence translations,
  ``TextResult.sentences``, given back to the source line their sentence starts in) and on
  whole paragraphs (both outputs joined by fives, against the references joined by fives);
  time against the same lines one sentence per line (``--no-split-sentences``).
- long: test2016 sentences joined with commas into one sentence of 400+ words; for each part,
  the share of its own translation's content words found in the long one's translation.
- glossary: test2016 lines with forced terms (dog -> Köter ...) and do-not-translate product
  names injected ("Fender guitar"); every term must appear; BLEU of the rest (see ``rest``).
- html: pages of real shape built from test2016 sentences; the output must parse, keep the tag
  sequence and script/code bytes, have its text translated; time against the same text plain;
  and how often an inline ``<b>`` around a known noun lands on its translation.
- alignment: which decoder layer's cross-attention puts known word pairs together.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_train import cpu_name  # noqa: E402

from xformer_cli.decode.factory import load_engine  # noqa: E402
from xformer_cli.device import cpu_flags  # noqa: E402
from xformer_cli.text import Glossary, TextOptions, translate_texts  # noqa: E402
from xformer_cli.text.align import AttentionAligner  # noqa: E402
from xformer_cli.text.html import parse_html  # noqa: E402

DATA = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))
SETS = {"test2016": ("multi30k/test2016.en", "multi30k/test2016.de"),
        "wmt14": ("wmt14/newstest2014.en", "wmt14/newstest2014.de")}
SENTENCE_END = re.compile(r"[.!?][\"'»“”)]*(?=\s|$)")
# Forced terms: a word the model knows, forced to a rarer synonym; and what it usually becomes.
FORCED = {"dog": ("Köter", ("Hund", "Hunde", "Hundes", "Hunden")),
          "man": ("Kerl", ("Mann", "Männer", "Mannes", "Männern")),
          "woman": ("Dame", ("Frau", "Frauen")),
          "street": ("Gasse", ("Straße", "Straßen")),
          "ball": ("Kugel", ("Ball", "Bälle", "Balls", "Ballen"))}
BRANDS = {"guitar": "Fender", "shirt": "Adidas", "bike": "Trek", "car": "Volvo", "camera": "Nikon"}
KNOWN = {"dog": "Hund", "man": "Mann", "woman": "Frau", "girl": "Mädchen", "boy": "Junge",
         "street": "Straße", "water": "Wasser", "ball": "Ball"}


def read(name: str, side: int) -> list[str]:
    return (DATA / SETS[name][side]).read_text(encoding="utf-8").splitlines()


def timed(fn: Callable):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def translate(engine, lines: list[str], chunk: int = 2000, **options) -> list:
    """``xformer translate``'s path: chunks of 2000 lines, each one engine call."""
    opts = TextOptions(source_lang="en", **options)
    return [r for at in range(0, len(lines), chunk) for r in translate_texts(engine, lines[at:at + chunk], opts)]


def bleu(hyps: list[str], refs: list[str]) -> float:
    """Corpus BLEU; nan for no lines (a share of the paragraphs that came out empty)."""
    return sacrebleu.corpus_bleu(hyps, [refs]).score if hyps else float("nan")


def resplit(lines: list[str], result) -> list[str]:
    """A paragraph's translation given back to its source ``lines`` (joined with one space):
    each sentence's translation to the line its source sentence starts in."""
    starts = [sum(len(line) + 1 for line in lines[:k]) for k in range(len(lines))]
    parts: list[list[str]] = [[] for _ in lines]
    for source_start, _, out_start, out_end in result.sentences:
        line = max(i for i, start in enumerate(starts) if start <= source_start)
        parts[line].append(result.text[out_start:out_end])
    return [" ".join(part) for part in parts]


def all_found(lines: list[str], result) -> bool:
    """Whether every source line of the paragraph starts a sentence the splitter found."""
    found = {start for start, _, _, _ in result.sentences}
    return all(sum(len(line) + 1 for line in lines[:k]) in found for k in range(len(lines)))


def paragraphs(engine, name: str, limit: int, repeats: int) -> None:
    src, ref = read(name, 0)[:limit], read(name, 1)[:limit]
    groups = [list(range(at, min(at + 5, len(src)))) for at in range(0, len(src), 5)]
    paras = [" ".join(src[i] for i in group) for group in groups]
    plain_times, para_times = [], []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        sent_out, seconds = timed(lambda: translate(engine, src, split_sentences=False))
        plain_times.append(seconds)
        para_out, seconds = timed(lambda: translate(engine, paras))
        para_times.append(seconds)
    sent_text = [r.text for r in sent_out]
    split_back = [line for group, r in zip(groups, para_out) for line in resplit([src[i] for i in group], r)]
    empty = sum(a == b or c == d for r in para_out for a, b, c, d in r.sentences)
    units = sum(len(r.sentences) for r in para_out)
    ends_equal = sum(len(SENTENCE_END.findall(r.text)) == sum(len(SENTENCE_END.findall(sent_text[i])) for i in g)
                     for r, g in zip(para_out, groups))
    print(f"paragraphs [{name}]: {len(src)} lines -> {len(paras)} paragraphs of 5; {units} sentences found by "
          f"the splitter, {empty} with an empty translation")
    print(f"  sentence ends: paragraph line = its 5 lines' translations in {ends_equal}/{len(paras)} paragraphs")
    print(f"  BLEU sentence file {bleu(sent_text, ref):.2f}; paragraph file re-split {bleu(split_back, ref):.2f}")
    same = sum(a == b for a, b in zip(split_back, sent_text))
    print(f"  agreement (the pipeline alone, whatever the model's quality): re-split line = sentence file's line in "
          f"{same}/{len(src)} lines; BLEU of the re-split file against the sentence file {bleu(split_back, sent_text):.2f}")
    whole = [i for g, r in zip(groups, para_out) if all_found([src[i] for i in g], r) for i in g]
    print(f"  paragraphs whose every line start the splitter found: {len(whole) // 5}/{len(paras)}; on their lines "
          f"BLEU sentence file {bleu([sent_text[i] for i in whole], [ref[i] for i in whole]):.2f}, re-split "
          f"{bleu([split_back[i] for i in whole], [ref[i] for i in whole]):.2f}; on the other lines "
          f"{bleu([sent_text[i] for i in range(len(src)) if i not in set(whole)], [ref[i] for i in range(len(src)) if i not in set(whole)]):.2f}"
          f" and {bleu([split_back[i] for i in range(len(src)) if i not in set(whole)], [ref[i] for i in range(len(src)) if i not in set(whole)]):.2f}")
    joined_refs = [" ".join(ref[i] for i in g) for g in groups]
    print(f"  BLEU by whole paragraphs: sentence file joined {bleu([' '.join(sent_text[i] for i in g) for g in groups], joined_refs):.2f}; "
          f"paragraph file {bleu([r.text for r in para_out], joined_refs):.2f}")
    print(f"  time (best of {repeats}): sentences one per line {min(plain_times):.1f} s, paragraphs "
          f"{min(para_times):.1f} s ({min(para_times) / min(plain_times):.2f}x); all runs: "
          f"{', '.join(f'{a:.1f}/{b:.1f}' for a, b in zip(plain_times, para_times))}")


STOP = set("ein eine einer eines einem einen der die das den dem des und mit auf in im an am zu von vor bei "
           "ist sind sich zwei drei hat haben wird während neben über unter aus für als".split())


def content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"\w+", text.lower()) if len(w) > 2 and w not in STOP]


def long_sentence(engine, words: int, count: int) -> None:
    src = read("test2016", 0)
    at = 0
    for number in range(count):
        parts = []
        while sum(len(p.split()) for p in parts) < words:
            parts.append(src[at].rstrip(" ."))
            at += 1
        sentence = ", ".join(parts) + "."
        (long_out,), seconds = timed(lambda: translate(engine, [sentence]))
        alone = translate(engine, parts, split_sentences=False)
        shares = []
        found = set(content_words(long_out.text))
        for own in alone:
            wanted = content_words(own.text)
            shares.append(sum(w in found for w in wanted) / max(len(wanted), 1))
        print(f"long sentence {number + 1}: {len(sentence.split())} words, {len(parts)} parts, "
              f"{len(long_out.text.split())} words out in {seconds:.1f} s; content words of each part's own "
              f"translation found: mean {sum(shares) / len(shares):.0%}, lowest {min(shares):.0%}, "
              f"parts under 50%: {sum(s < 0.5 for s in shares)}")


def glossary_lines(limit: int) -> tuple[list[str], list[str], list[str], Glossary]:
    """(original lines, lines with brand names injected, references, glossary)."""
    src, ref = read("test2016", 0), read("test2016", 1)
    terms = {source: target for source, (target, _) in FORCED.items()}
    terms.update({brand: brand for brand in BRANDS.values()})
    chosen = [(s, r) for s, r in zip(src, ref)
              if any(re.search(rf"\b{w}\b", s) for w in list(FORCED) + list(BRANDS))][:limit]
    injected = []
    for line, _ in chosen:
        for noun, brand in BRANDS.items():
            line = re.sub(rf"\b{noun}\b", f"{brand} {noun}", line)
        injected.append(line)
    return [s for s, _ in chosen], injected, [r for _, r in chosen], Glossary.from_dict(terms)


def rest(text: str) -> str:
    """A line without the glossary's words: forced targets, the usual translations of the forced
    source words (in the references and the unforced output) and the brand names; what is left
    is what the glossary must not damage."""
    drop = {t for t, _ in FORCED.values()} | {u for _, usual in FORCED.values() for u in usual} | set(BRANDS.values())
    return " ".join(w for w in text.split() if w.strip(".,;:!?\"'") not in drop)


def glossary(engine, limit: int) -> None:
    original, injected, refs, terms = glossary_lines(limit)
    base = [r.text for r in translate(engine, original)]
    rest_refs = [rest(r) for r in refs]
    print(f"glossary: {len(original)} test2016 lines with {len(terms.terms)} terms "
          f"(forced: {', '.join(f'{s}->{t}' for s, (t, _) in FORCED.items())}; kept: {', '.join(BRANDS.values())})")
    print(f"  without glossary (original lines): BLEU {bleu(base, refs):.2f}, BLEU of the rest {bleu([rest(h) for h in base], rest_refs):.2f}")
    plain = [r.text for r in translate(engine, injected)]
    print(f"  without glossary (lines with the names): BLEU of the rest {bleu([rest(h) for h in plain], rest_refs):.2f}")
    for placeholders in (False, True):
        out, seconds = timed(lambda: [r.text for r in translate(engine, injected, glossary=terms, placeholders=placeholders)])
        wanted = found = 0
        for line, hyp in zip(injected, out):
            for source, target in terms.terms.items():
                need = len(re.findall(rf"(?<!\w){re.escape(source)}(?!\w)", line))
                wanted += need
                found += min(need, len(re.findall(rf"(?<!\w){re.escape(target)}(?!\w)", hyp)))
        name = "placeholders" if placeholders else "aligned replacement (default)"
        print(f"  {name}: terms found {found}/{wanted}; BLEU of the rest "
              f"{bleu([rest(h) for h in out], rest_refs):.2f}; {seconds:.1f} s")


class TagReader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tags.append(("end", tag))

    def handle_data(self, data):
        self.text.append(data)


def read_tags(page: str) -> TagReader:
    reader = TagReader()
    reader.feed(page)
    reader.close()
    return reader


def bolded(sentence: str) -> tuple[str, str]:
    """The sentence with <b> around its first known noun, and that noun's translation ("" if none)."""
    for noun, german in KNOWN.items():
        if re.search(rf"\b{noun}\b", sentence):
            return re.sub(rf"\b{noun}\b", f"<b>{noun}</b>", sentence, count=1), german
    return sentence, ""


def make_page(sents: list[str], number: int) -> str:
    s = iter(sents)
    b1, _ = bolded(next(s))
    b2, _ = bolded(next(s))
    return (f"<!DOCTYPE html>\n<html><head><title>{next(s)}</title>\n<script>var page = {number}; "
            f"if (a < b && c > d) {{ document.title = \"<b>x</b>\"; }}</script></head>\n<body>\n"
            f"<h1>{next(s)}</h1>\n<p>{b1} {b2} See <a href=\"/p?id={number}&amp;x=1\">{next(s)}</a> &amp; more.</p>\n"
            f"<ul>\n  <li>{next(s)}</li>\n  <li>{next(s)} &copy; 2024</li>\n  <li><i>{next(s)}</i></li>\n</ul>\n"
            f"<h2>{next(s)}</h2>\n<p>{next(s)}&nbsp;{next(s)}</p>\n"
            f"<pre><code>for dog in dogs:\n    print(\"A man &lt;b&gt;\", dog)\n</code></pre>\n</body></html>\n")


def html_pages(engine, count: int) -> None:
    src = read("test2016", 0)
    pages = [make_page(src[at * 11:(at + 1) * 11], at) for at in range(count)]
    out, html_seconds = timed(lambda: [r.text for r in translate(engine, pages, format="html")])
    plain_text = [segment.text for page in pages for segment in parse_html(page).segments]
    _, plain_seconds = timed(lambda: translate(engine, plain_text))
    keep = re.compile(r"<script>.*?</script>|<pre>.*?</pre>", re.S)
    tags_equal = sum(read_tags(a).tags == read_tags(b).tags for a, b in zip(pages, out))
    kept = sum(keep.findall(a) == keep.findall(b) for a, b in zip(pages, out))
    changed = total = 0
    for page, translated in zip(pages, out):
        for a, b in zip(read_tags(page).text, read_tags(translated).text):
            if re.search(r"[A-Za-z]{3}", a) and "print(" not in a and "document" not in a:
                total += 1
                changed += a.strip() != b.strip()
    print(f"html: {count} pages ({sum(map(len, pages))} characters); parse and tag sequence equal {tags_equal}/{count}; "
          f"script and code byte-identical {kept}/{count}; text nodes translated {changed}/{total}")
    print(f"  time: html {html_seconds:.1f} s, the same text plain ({len(plain_text)} blocks) {plain_seconds:.1f} s "
          f"({html_seconds / plain_seconds:.2f}x)")
    for aligner in ("attention", "relative"):
        hits = wanted = 0
        for sentence in src[: 400]:
            marked, german = bolded(sentence)
            if not german:
                continue
            result = translate(engine, [f"<p>{marked}</p>"], format="html", aligner=aligner)[0].text
            inside = re.search(r"<b>(.*?)</b>", result)
            wanted += 1
            hits += bool(inside and german in inside.group(1) and len(inside.group(1).split()) == 1)
        print(f"  inline <b> around a known noun lands on exactly its translation ({aligner}): {hits}/{wanted}")


def alignment_layers(engine, limit: int) -> None:
    src = read("test2016", 0)[:limit]
    found = engine.search(src, engine.options())
    layers = len(engine.model.decoder_layers)
    for layer in range(-1, -layers - 1, -1):
        aligner = AttentionAligner(lambda s, t: engine.alignment_weights(s, t, layer),
                                   engine.tokenizer.src_pieces, engine.tokenizer.tgt_pieces)
        good = total = 0
        for line, hyps in zip(src, found):
            target = engine.detokenize(hyps[0])
            for english, german in KNOWN.items():
                ours, theirs = list(re.finditer(rf"\b{english}\b", line)), re.findall(rf"\b{german}\b", target)
                if len(ours) == 1 and len(theirs) == 1:
                    a, b = aligner(line, target, hyps[0].tokens, [(ours[0].start(), "start"), (ours[0].end(), "end")])
                    total += 1
                    good += target[a:b].strip(".,") == german
        print(f"alignment: decoder layer {layer}: {good}/{total} known word pairs aligned exactly")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--engine", default="xformer", help="xformer (attention alignment) or auto")
    parser.add_argument("--only", nargs="*", default=["paragraphs", "long", "glossary", "html", "alignment"])
    parser.add_argument("--paragraph-set", nargs="*", default=["test2016"], choices=sorted(SETS))
    parser.add_argument("--lines", type=int, default=0, help="paragraph check: first N lines (0 = all)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    engine = load_engine(args.checkpoint, engine=args.engine, threads=args.threads)
    flags = cpu_flags()
    print(f"machine: {cpu_name()}; avx512_bf16 {'avx512_bf16' in flags}, amx {'amx_tile' in flags}; "
          f"engine {engine.name}, {getattr(engine, 'threads', '?')} threads; model {args.checkpoint}")
    for name in args.paragraph_set if "paragraphs" in args.only else []:
        paragraphs(engine, name, args.lines or 10**9, args.repeats)
    if "long" in args.only:
        long_sentence(engine, 400, 3)
    if "glossary" in args.only:
        glossary(engine, 200)
    if "html" in args.only:
        html_pages(engine, 20)
    if "alignment" in args.only:
        alignment_layers(engine, 400)


if __name__ == "__main__":
    main()

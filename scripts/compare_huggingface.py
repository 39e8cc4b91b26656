"""xformer against its Hugging Face export: the same test set through both engines.

Exports the checkpoint (``xformer export --format huggingface``), then translates the test
set with Hugging Face ``generate`` (MarianMTModel, or Pegasus for a pre-norm model) + ``MarianTokenizer`` and with xformer's
``Translator`` (fp32), greedy and beam search, and prints for each the lines identical to
xformer's and sacreBLEU against the reference.

    python scripts/compare_huggingface.py --checkpoint runs/multi30k/best.pt
    python scripts/compare_huggingface.py --checkpoint runs/multi30k/best.pt --hf-length-penalty 0.42 0.6

Hugging Face has one length limit per ``generate`` call, xformer one per sentence
(max_len_a * source length + max_len_b). So Hugging Face translates the sentences grouped by
source length, each group with that length's limit (``xformer_max_new_tokens``): the exact
rule, with no padding in any batch. Beam search runs once per ``--hf-length-penalty`` value
(default: the export's own, from generation_config.json). Then both once more as a user would
call them: padded batches in input order, every setting from generation_config.json (one
length limit, that of the longest source xformer keeps).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import sacrebleu
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from xformer_cli.decode.translator import Translator  # noqa: E402
from xformer_cli.export.huggingface import export_huggingface, xformer_max_new_tokens  # noqa: E402

DATA = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def hf_translate(model, tokenizer, lines: list[str], beam: int, a: float, b: int, length_penalty: float,
                 batch_size: int) -> list[str]:
    """Hugging Face translations in input order, each group of equal source length with its own limit."""
    groups: dict[int, list[int]] = defaultdict(list)
    encoded = tokenizer(lines, truncation=True)["input_ids"]
    for i, ids in enumerate(encoded):
        groups[len(ids)].append(i)
    out = [""] * len(lines)
    for length, members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start:start + batch_size]
            input_ids = torch.tensor([encoded[i] for i in chunk])
            with torch.no_grad():
                generated = model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), num_beams=beam,
                    length_penalty=length_penalty, max_new_tokens=xformer_max_new_tokens(length, a, b),
                )
            for i, text in zip(chunk, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                out[i] = text
    return out


def hf_translate_plain(model, tokenizer, lines: list[str], beam: int, batch_size: int) -> list[str]:
    """As a user would: padded batches in input order, everything else from generation_config.json."""
    out: list[str] = []
    for start in range(0, len(lines), batch_size):
        inputs = tokenizer(lines[start:start + batch_size], truncation=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            out += tokenizer.batch_decode(model.generate(**inputs, num_beams=beam), skip_special_tokens=True)
    return out


def report(name: str, hyps: list[str], refs: list[str], reference: list[str] | None, seconds: float) -> None:
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    same = "" if reference is None else f"  identical to xformer: {sum(h == r for h, r in zip(hyps, reference))}/{len(hyps)}"
    print(f"{name:34s} BLEU {bleu.score:6.2f}{same}  ({seconds:.1f} s)", flush=True)


def show_differences(hyps: list[str], reference: list[str], src: list[str], pieces, limit: int = 3) -> None:
    """How the differing lines differ in length (in target pieces), and the first few of them."""
    differ = [i for i, (h, r) in enumerate(zip(hyps, reference)) if h != r]
    if not differ:
        return
    longer = sum(len(pieces(hyps[i])) > len(pieces(reference[i])) for i in differ)
    shorter = sum(len(pieces(hyps[i])) < len(pieces(reference[i])) for i in differ)
    print(f"  {len(differ)} differ: Hugging Face longer in {longer}, shorter in {shorter}, "
          f"as long in {len(differ) - longer - shorter}")
    for i in differ[:limit]:
        print(f"  line {i + 1}: {src[i]}\n    xformer: {reference[i]}\n    HF:      {hyps[i]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", default=str(DATA / "multi30k" / "test2016.en"))
    parser.add_argument("--ref", default=str(DATA / "multi30k" / "test2016.de"))
    parser.add_argument("--export-dir", default=None, help="Where to export (default: a temporary directory).")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--hf-length-penalty", type=float, nargs="*", default=None,
                        help="Hugging Face length_penalty values for beam search (default: the export's).")
    parser.add_argument("--batch-size", type=int, default=64, help="Hugging Face sentences per generate call at most.")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForSeq2SeqLM, GenerationConfig, MarianTokenizer
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")  # MarianTokenizer never uses it here
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    src, refs = read(Path(args.src)), read(Path(args.ref))
    with tempfile.TemporaryDirectory(prefix="xformer-hf-") as tmp:
        out = export_huggingface(args.checkpoint, args.export_dir or Path(tmp) / "hf", force=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
        tokenizer = MarianTokenizer.from_pretrained(out)
        generation = GenerationConfig.from_pretrained(out)
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu", precision="fp32")
    decode = translator.decode
    a, b, alpha = decode.max_len_a, decode.max_len_b, decode.length_penalty
    print(f"checkpoint {args.checkpoint}: {len(src)} lines, max length {a} * source + {b}, beam {args.beam}, "
          f"xformer alpha {alpha}, export's length_penalty {generation.length_penalty}, {args.threads} thread(s)")

    start = time.perf_counter()
    x_greedy = translator.translate(src, beam_size=1)
    report("xformer greedy", x_greedy, refs, None, time.perf_counter() - start)
    start = time.perf_counter()
    h_greedy = hf_translate(model, tokenizer, src, 1, a, b, 1.0, args.batch_size)
    report("Hugging Face greedy", h_greedy, refs, x_greedy, time.perf_counter() - start)
    pieces = translator.tokenizer.tgt.encode
    show_differences(h_greedy, x_greedy, src, pieces)

    start = time.perf_counter()
    plain = hf_translate_plain(model, tokenizer, src, 1, args.batch_size)
    report("HF greedy, padded, config limit", plain, refs, x_greedy, time.perf_counter() - start)
    show_differences(plain, x_greedy, src, pieces)

    start = time.perf_counter()
    x_beam = translator.translate(src, beam_size=args.beam, length_penalty=alpha)
    report(f"xformer beam {args.beam} (GNMT alpha {alpha})", x_beam, refs, None, time.perf_counter() - start)
    for lp in args.hf_length_penalty or [generation.length_penalty]:
        start = time.perf_counter()
        h_beam = hf_translate(model, tokenizer, src, args.beam, a, b, lp, args.batch_size)
        report(f"Hugging Face beam {args.beam} (lp {lp})", h_beam, refs, x_beam, time.perf_counter() - start)
        show_differences(h_beam, x_beam, src, pieces)
    start = time.perf_counter()
    plain = hf_translate_plain(model, tokenizer, src, args.beam, args.batch_size)
    report(f"HF beam {args.beam}, padded, config", plain, refs, x_beam, time.perf_counter() - start)
    show_differences(plain, x_beam, src, pieces)


if __name__ == "__main__":
    main()

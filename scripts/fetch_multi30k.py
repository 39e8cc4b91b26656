"""Download Multi30k into the folder the configs read, for a machine without the data folder.

Writes ``DIR/multi30k/`` (DIR: --out, else $XFORMER_DATA, else ../shared/data, as the configs'
``${XFORMER_DATA:-../shared/data}``) from the ``multi30k/dataset`` GitHub repository at a fixed commit:

- task 1, gunzipped byte for byte: ``train``, ``valid`` and ``test2016`` in en, de, fr and cs (the
  main job, the multilingual configs; the main job can also read the Hub's copy without this);
- task 2's captions made into the pipeline's monolingual text, ``mono.de`` and ``mono.en``: the five
  caption files of the training images in order, each line stripped of the spaces around it, without
  empty lines, without any line that is a sentence of a Multi30k valid or test set (mono.en: nor of
  task 1's train.en), each line once.

A file already there is kept (--force replaces it); each is written whole or not at all.

    python scripts/fetch_multi30k.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xformer_cli.errors import XformerError  # noqa: E402
from xformer_cli.fileio import atomic_file  # noqa: E402

COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
BASE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/"
SPLITS = {"train": "train", "valid": "val", "test2016": "test_2016_flickr"}  # our name: upstream's
LANGUAGES = ("en", "de", "fr", "cs")
HELD_OUT = ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
CAPTION_FILES = 5
CONFIGS_DATA = Path(os.environ.get("XFORMER_DATA") or "../shared/data")  # the configs' ${XFORMER_DATA:-../shared/data}

Fetch = Callable[[str], bytes]


def fetcher(base_url: str, timeout: float = 120.0) -> Fetch:
    """Upstream's file at ``path`` (under data/), gunzipped; a failed download is one line."""

    def fetch(path: str) -> bytes:
        url = base_url + path
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                packed = response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise XformerError(f"could not download {url}: {getattr(exc, 'reason', exc)}") from None
        try:
            return gzip.decompress(packed)
        except (OSError, EOFError) as exc:
            raise XformerError(f"{url} is not a whole gzip file ({exc}): a download cut short? run again") from None

    return fetch


def lines_of(data: bytes, name: str) -> list[str]:
    """A file's lines as written (split at newlines only: str.splitlines would also split inside a
    caption at the other Unicode line breaks)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise XformerError(f"{name}: not UTF-8 ({exc})") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def monolingual(captions: Iterable[str], held_out: set[str]) -> Iterator[str]:
    """Each caption once, in order, without the spaces around it, without empty ones and without
    any held-out sentence."""
    seen: set[str] = set()
    for line in captions:
        line = line.strip()
        if not line or line in held_out or line in seen:
            continue
        seen.add(line)
        yield line


def held_out_sentences(fetch: Fetch, lang: str) -> set[str]:
    """Every sentence of Multi30k's valid and test sets in ``lang`` (task 1)."""
    sentences: set[str] = set()
    for split in HELD_OUT:
        path = f"task1/raw/{split}.{lang}.gz"
        sentences.update(line.strip() for line in lines_of(fetch(path), path))
    return sentences


def mono_lines(fetch: Fetch, lang: str) -> list[str]:
    held_out = held_out_sentences(fetch, lang)
    if lang == "en":  # the English captions must not repeat the parallel corpus's source side
        held_out.update(line.strip() for line in lines_of(fetch("task1/raw/train.en.gz"), "train.en"))
    captions = (line for k in range(1, CAPTION_FILES + 1)
                for line in lines_of(fetch(f"task2/raw/train.{k}.{lang}.gz"), f"train.{k}.{lang}"))
    return list(monolingual(captions, held_out))


def write(path: Path, data: bytes, say: Callable[[str], None]) -> None:
    with atomic_file(path, "wb") as handle:
        handle.write(data)
    lines = data.count(b"\n")
    say(f"wrote {path} ({lines:,} lines)")


def fetch_multi30k(out: Path, fetch: Fetch, force: bool = False, say: Callable[[str], None] = print) -> None:
    """Every file of ``out/multi30k`` this script makes, each downloaded once (``fetch``: upstream's
    file by its path under data/, gunzipped)."""
    folder = out / "multi30k"
    folder.mkdir(parents=True, exist_ok=True)
    downloaded: dict[str, bytes] = {}

    def once(path: str) -> bytes:  # the mono files read task 1's files again
        if path not in downloaded:
            downloaded[path] = fetch(path)
        return downloaded[path]

    wanted = {f"{ours}.{lang}": f"task1/raw/{theirs}.{lang}.gz" for ours, theirs in SPLITS.items() for lang in LANGUAGES}
    wanted.update({f"mono.{lang}": None for lang in ("de", "en")})
    for name, upstream in wanted.items():
        path = folder / name
        if path.exists() and not force:
            say(f"kept {path} (there already; --force replaces it)")
            continue
        lang = name.rsplit(".", 1)[1]
        data = once(upstream) if upstream else "".join(line + "\n" for line in mono_lines(once, lang)).encode()
        write(path, data, say)


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CONFIGS_DATA,
                        help="the data folder (default: $XFORMER_DATA, else ../shared/data, as the configs read)")
    parser.add_argument("--base-url", default=BASE_URL, help="where upstream's data/ folder is (a mirror)")
    parser.add_argument("--force", action="store_true", help="replace files that are there already")
    args = parser.parse_args(argv)
    try:
        fetch_multi30k(args.out, fetcher(args.base_url), args.force)
    except XformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out.resolve() != CONFIGS_DATA.resolve():
        print(f"the configs read ${{XFORMER_DATA:-../shared/data}}: export XFORMER_DATA={args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

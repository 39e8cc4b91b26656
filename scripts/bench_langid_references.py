"""How often py3langid misnames the language of human references: the floor under eval-bleu's
off-target rate. Every line of each language's files, classified among all of py3langid's
languages and among the given ones only (what xformer_cli/langid.detected_among does).

    python scripts/bench_langid_references.py --folder ../shared/data/multi30k --langs en,de,fr,cs
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from xformer_cli.langid import detected_among, identifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="../shared/data/multi30k")
    parser.add_argument("--langs", default="en,de,fr,cs")
    parser.add_argument("--splits", default="valid,test2016")
    args = parser.parse_args()
    langs = args.langs.split(",")
    ident = identifier()
    for split in args.splits.split(","):
        for lang in langs:
            lines = (Path(args.folder) / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            every = [ident.classify(line)[0] for line in lines]
            among = detected_among(lines, langs)
            wrong = Counter(code for code in every if code != lang)
            print(f"{split}.{lang}: {len(lines)} lines; all languages: {sum(wrong.values())} misnamed "
                  f"{dict(wrong.most_common(3))}; among {','.join(langs)}: {sum(c != lang for c in among)} misnamed")


if __name__ == "__main__":
    main()

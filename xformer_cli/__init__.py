"""xformer: a from-scratch Transformer translation trainer (train, translate, eval-bleu)."""

from typing import Any

from xformer_cli.version import __version__

__all__ = ["Translator", "load_engine", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy so that `xformer --help` does not pay for importing torch.
    if name == "Translator":
        from xformer_cli.decode.translator import Translator

        return Translator
    if name == "load_engine":  # any engine, chosen as the CLI chooses (decode/factory.py)
        from xformer_cli.decode.factory import load_engine

        return load_engine
    raise AttributeError(name)

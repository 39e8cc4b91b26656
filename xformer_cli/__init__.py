"""xformer: a from-scratch Transformer translation trainer (train, translate, eval-bleu)."""

__version__ = "0.1.0"

__all__ = ["Translator", "__version__"]


def __getattr__(name: str):
    # Lazy so that `xformer --help` does not pay for importing torch.
    if name == "Translator":
        from xformer_cli.decode.translator import Translator

        return Translator
    raise AttributeError(name)

"""Where a trained checkpoint goes next: CTranslate2 (``ctranslate2.py``)."""

from xformer_cli.export.ctranslate2 import export_ctranslate2

__all__ = ["export_ctranslate2"]

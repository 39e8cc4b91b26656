"""Where a trained checkpoint goes next: CTranslate2 (``ctranslate2.py``, with an optional
lexical shortlist: ``shortlist.py``) and Hugging Face transformers' MarianMT (``huggingface.py``);
``common.py`` holds what both exporters share, ``format.py`` the export directory's file names."""

FORMATS = ("ctranslate2", "huggingface")  # what export --format writes

"""Where a trained checkpoint goes next: CTranslate2 (``ctranslate2.py``) and Hugging Face
transformers' MarianMT (``huggingface.py``); ``common.py`` holds what both exporters share."""

FORMATS = ("ctranslate2", "huggingface")

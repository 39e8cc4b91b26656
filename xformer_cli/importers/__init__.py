"""Importers of models trained elsewhere (MarianMT / OPUS-MT: ``marian.py``, reading its files with
``marian_files.py``)."""

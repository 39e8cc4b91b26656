"""Importers of models trained elsewhere (MarianMT / OPUS-MT: ``marian.py``)."""

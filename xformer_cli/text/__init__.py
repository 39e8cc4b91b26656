"""Real text around the sentence-level engines: paragraphs split into sentences, long
sentences cut, HTML translated around its tags, glossaries and do-not-translate terms.

    from xformer_cli.text import TextOptions, translate_texts
    translate_texts(engine, ["One sentence. Another one."], TextOptions(source_lang="en"))

``translation.py`` plans every text into engine-sized units (``sentences.py``, ``long.py``,
``glossary.py``, ``html.py``), sends all the units of a chunk to the engine in one call, and
joins the translations back, whitespace and tags as in the source.
"""

from xformer_cli.text.glossary import Glossary, load_glossary
from xformer_cli.text.translation import TextOptions, TextResult, translate_texts

__all__ = ["Glossary", "TextOptions", "TextResult", "load_glossary", "translate_texts"]

"""``xformer serve``: a LibreTranslate-compatible HTTP API and a web page over one model.

- ``batcher``: the micro-batching queue (pure Python and a thread);
- ``engine``: loading a model and calling its ``translate`` (the only engine access);
- ``protocol``: LibreTranslate's request/response shapes, checked;
- ``app``: the FastAPI app; ``page``: the web page; ``server``: uvicorn, signals, ``serve()``.
FastAPI and uvicorn are imported only when serving: ``pip install 'xformer[serve]'``.
"""

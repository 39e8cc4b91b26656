"""``xformer serve``: a LibreTranslate-compatible HTTP API and a web page over one model.

- ``batcher``: the micro-batching queue (pure Python and a thread);
- ``engine``: loading a model and calling its ``translate`` (the only engine access);
- ``protocol``: LibreTranslate's request/response shapes, checked;
- ``reading``: a request's body, fields and uploads, and the API key;
- ``queueing``: one request's translation through the batcher, dropped if its client leaves;
- ``detect``: language identification (``/detect``, ``source: "auto"``);
- ``files``: the files of ``/translate_file`` and the store they wait in for their download;
- ``cors``: CORS headers, for the origins given;
- ``app``: the FastAPI app; ``extras``: its LibreTranslate endpoints beyond ``/translate``;
  ``page``: the web page; ``server``: uvicorn, signals, ``serve()``.
FastAPI and uvicorn are imported only when serving: ``pip install 'xformer[serve]'``.
"""

"""The web page at ``/``: ``page.html`` (inline CSS and JS, no outside assets) with the
model's details filled in."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

PLACEHOLDER = "__XFORMER_CONFIG__"


def render_page(info: dict[str, Any]) -> str:
    html = resources.files("xformer_cli.serve").joinpath("page.html").read_text(encoding="utf-8")
    # JSON inside <script>: no "<", ">" or "&" left that could end the element early
    config = json.dumps(info).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return html.replace(PLACEHOLDER, config)

"""The ``xformer`` command line: parse options, call the library, map errors to exit codes.

A user error (``XformerError``) prints one line, ``error: ...``, on stderr and exits 1;
Ctrl-C exits 130. Heavy imports (torch) happen inside the commands so ``--help`` is quick.

One module per group of commands (``common.py``: what they share); importing this package
registers them all on ``app``, in the order ``--help`` lists them."""

from xformer_cli.cli.common import app
# Registers the commands on ``app``, in this order.
from xformer_cli.cli import training, translating, export_import, scoring, serving  # noqa: F401

__all__ = ["app"]

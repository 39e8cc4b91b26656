"""``python -m xformer_cli`` is the ``xformer`` command (also what torchrun launches)."""

from xformer_cli.cli import app

app(prog_name="xformer")

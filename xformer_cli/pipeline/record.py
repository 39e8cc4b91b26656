"""What a stage leaves behind to be skipped or resumed: ``<run_dir>/<stage>/stage.json``
with the fingerprint of its inputs (settings, data files, upstream stages' fingerprints)
and whether it finished. Like the token cache: the same fingerprint and done means skip,
the same fingerprint not done means resume, another fingerprint means start the stage over,
with the finished output of the old inputs set aside (``<stage>.replaced``) until the new
one finishes, and put back if it fails.

A record names the run's own files as ``<run_dir>/...`` and its fingerprint hashes their paths
so: a run folder moved or copied elsewhere keeps every finished stage (``at_home``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from xformer_cli.fileio import atomic_file

RECORD = "stage.json"
HOME = "<run_dir>"
DONE, ASIDE, RESUMABLE, CHANGED, STOPPED, NEW = "done", "aside", "resumable", "changed", "stopped", "new"
# How often a running stage writes its minutes so far into its record: what a kill -9 loses of them.
TICK_SECONDS = 30.0


def fingerprint(*parts: Any, home: Optional[Path] = None) -> str:
    """A short hash of JSON-able parts (dicts hashed with sorted keys); each path under ``home``
    (the pipeline's run_dir, as given or resolved) is hashed as <run_dir>/..."""
    text = json.dumps(parts, sort_keys=True, default=str)
    if home is not None:
        forms = sorted({str(home), str(home.resolve())}, key=len, reverse=True)
        escaped = "|".join(re.escape(json.dumps(form)[1:-1]) for form in forms)
        text = re.sub(f'"(?:{escaped})(?=[/"])', lambda _: '"' + HOME, text)  # a whole string's start only
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def at_home(path: Path | str, home: Path) -> str:
    """``path`` as a record keeps it: <run_dir>/... when it lies under ``home``, else as given."""
    try:
        inside = Path(path).resolve().relative_to(home.resolve())
    except ValueError:
        return str(path)
    return f"{HOME}/{inside.as_posix()}" if inside.parts else HOME


def rebased(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON-like) with each string naming ``old`` or a path under it naming the same
    under ``new``: a record's or a checkpoint's config's paths, after their folder moved."""
    if isinstance(value, dict):
        return {key: rebased(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [rebased(item, old, new) for item in value]
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        return new + value[len(old):]
    return value


def from_home(kept: str, home: Path) -> Path:
    """A path a record keeps, under ``home`` where it says <run_dir> (an older record's are absolute)."""
    if kept == HOME or kept.startswith(HOME + "/"):
        return home / kept[len(HOME) + 1:]
    return Path(kept)


def held_fingerprint(record: dict, form: str = "") -> str:
    """The fingerprint a stage's record holds in ``form`` (one of earlier_forms.OLD_STAMPS; "" the current):
    a record upgraded from that form keeps it in ``old_fingerprints`` (``old_fingerprint``: the
    "absolute" one, as the first upgrade kept it); one never upgraded holds only its own."""
    return old_fingerprints(record).get(form, record["fingerprint"]) if form else record["fingerprint"]


def old_fingerprints(record: dict) -> dict[str, str]:
    """The earlier forms' fingerprints a record upgraded from them keeps, by form."""
    first = {"absolute": record["old_fingerprint"]} if "old_fingerprint" in record else {}
    return {**first, **record.get("old_fingerprints", {})}


@dataclass
class StageRecord:
    """One stage's folder and its record."""

    name: str
    directory: Path

    @property
    def path(self) -> Path:
        return self.directory / RECORD

    def read(self) -> Optional[dict]:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # none yet, or damaged: the stage is done again
        # A record without its fingerprint (hand-edited, half copied) is damaged too: no inputs to match
        return record if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) else None

    def done_with(self, fingerprint: str) -> bool:
        return self.standing(fingerprint) == DONE

    @property
    def replaced(self) -> Path:
        """Where a finished output waits while its stage is redone with other inputs."""
        return self.directory.with_name(self.directory.name + ".replaced")

    def begin(self, fingerprint: str) -> bool:
        """Make ready to run with ``fingerprint``; True when an unfinished run of the same
        inputs is there to resume (a redo killed part-way too: it goes on where it stopped, not
        from the start). A finished output (of other inputs, or of these on a redo) is set
        aside, to come back if the new run fails (``restore``) and go when it finishes
        (``drop_replaced``); an unfinished one of other inputs is removed."""
        record = self.read()
        if record is not None and record.get("fingerprint") == fingerprint and not record.get("done"):
            return True
        if self.directory.exists():
            if record is not None and record.get("done"):
                shutil.rmtree(self.replaced, ignore_errors=True)
                os.replace(self.directory, self.replaced)
            else:  # an unfinished run of other inputs: a finished one may already wait aside
                shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self.write({"stage": self.name, "fingerprint": fingerprint, "done": False})
        return False

    def restore(self) -> bool:
        """Put back the finished output a failed redo set aside; False when none waits."""
        if not self.replaced.is_dir():
            return False
        shutil.rmtree(self.directory, ignore_errors=True)
        os.replace(self.replaced, self.directory)
        return True

    def standing(self, fingerprint: str) -> str:
        """Where the stage stands for inputs of ``fingerprint``, read only, in the order a run
        checks: DONE (finished with them), ASIDE (finished with them and set aside by a redo
        that was killed: put back, it is done), RESUMABLE (begun with them), CHANGED (finished
        with other inputs), STOPPED (begun with other inputs) or NEW."""
        record = self.read()
        if record and record.get("fingerprint") == fingerprint and record.get("done"):
            return DONE
        aside = StageRecord(self.name, self.replaced).read()
        if aside and aside.get("done") and aside.get("fingerprint") == fingerprint:
            return ASIDE
        if record and record.get("fingerprint") == fingerprint:
            return RESUMABLE
        if record:
            return CHANGED if record.get("done") else STOPPED
        return NEW

    def minutes_so_far(self) -> float:
        """The minutes an unfinished run of the stage has spent in the calls before (0: none)."""
        record = self.read() or {}
        value = record.get("minutes_so_far", 0.0)
        return float(value) if isinstance(value, (int, float)) and not record.get("done") else 0.0

    @contextlib.contextmanager
    def ticking(self, before: float) -> Iterator[Callable[[], float]]:
        """While the block runs, the record's ``minutes_so_far`` (``before`` plus this call's) is
        rewritten every TICK_SECONDS and once more when it ends, however it ends: a call that
        resumes the stage goes on from them, so a stage's minutes are those of all its calls
        (a kill -9 loses the last tick's). Yields the minutes so far."""
        started = time.monotonic()
        stop = threading.Event()

        def total() -> float:
            return before + (time.monotonic() - started) / 60

        def tick() -> None:
            while not stop.wait(TICK_SECONDS):
                self._note(total())

        clock = threading.Thread(target=tick, name=f"{self.name}-minutes", daemon=True)
        clock.start()
        try:
            yield total
        finally:
            stop.set()
            clock.join()
            self._note(total())

    def _note(self, minutes: float) -> None:
        with contextlib.suppress(OSError):  # a tick missed (a full disk) costs a few minutes' count only
            record = self.read()
            if record is not None and not record.get("done"):
                self.write({**record, "minutes_so_far": round(minutes, 2)})

    def drop_replaced(self) -> None:
        shutil.rmtree(self.replaced, ignore_errors=True)

    def finish(self, fingerprint: str, **results: Any) -> None:
        self.write({"stage": self.name, "fingerprint": fingerprint, "done": True, **results})

    def write(self, record: dict) -> None:
        with atomic_file(self.path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.write("\n")

"""Records written by earlier versions of xformer, whose fingerprints took the same inputs in
another form: recognised and upgraded in place once (``upgrade``), so that a new version
keeps every finished stage of an old run folder and resumes its begun one."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp, stamps_by_time
from xformer_cli.pipeline.record import HOME, old_fingerprints, rebased
from xformer_cli.pipeline.stages import FINGERPRINTS, Pipeline

# Fingerprints as records of earlier versions hold them, newest first, each form also without
# the changes of the forms before it: "text_files" stamped the training corpora's text files
# alone (not the valid set, data files or saved datasets); "by_time" stamped files by size and
# modification time (before content hashes); "absolute" also hashed the run folder's own paths
# as they were (before run folders could move).
OLD_STAMPS = ("text_files", "by_time", "absolute")


def old_fingerprint(pipe: Pipeline, stage: str, form: str) -> str:
    """``stage``'s fingerprint of these inputs as an earlier version's record would hold it
    (``form`` one of OLD_STAMPS)."""
    earlier = replace(pipe, old_stamps=form)
    if form == "text_files":
        return FINGERPRINTS[stage](earlier)
    with stamps_by_time():
        return FINGERPRINTS[stage](earlier)


def checked_fingerprint(pipe: Pipeline, stage: str, form: str) -> str:
    """``stage``'s fingerprint of these inputs, every file stamped as now, with its upstream
    stages as their records held them in ``form``: what an upgrade from ``form`` saw, unmoved by
    the upstream stages' own upgrades after it (an earlier form that stamped fewer files
    matches again after an edit of the others: this one does not)."""
    return FINGERPRINTS[stage](replace(pipe, upstream_form=form))


def current_stamp(stamp: str) -> str:
    """A file stamp an earlier version wrote (path, size, mtime) as ``file_stamp`` writes it now,
    when the file is still as it was then; else as it was."""
    path = stamp.rsplit("|", 2)[0]
    try:
        with stamps_by_time():
            same = file_stamp(path) == stamp
        return file_stamp(path) if same else stamp
    except XformerError:  # gone or unreadable: the stage that reads it says so
        return stamp


def upgrade(pipe: Pipeline, name: str, stamp: str) -> bool:
    """A stage's record made by an earlier version (``OLD_STAMPS``) of these inputs at this path:
    it takes the new fingerprint (the earlier forms' kept for the stages after it to check theirs
    against) and names its files under <run_dir>, as a new record would. Finished, it stays
    finished; begun, it resumes."""
    found = upgradable(pipe, name)
    if found is None:
        return False
    old, matched = found
    upgraded = {key: value for key, value in old.items() if key != "old_fingerprint"}
    for spelling in {str(pipe.run_dir), str(pipe.run_dir.resolve())}:  # the models, corpora, summary it names
        upgraded = rebased(upgraded, spelling, HOME)
    if isinstance(old.get("mono_read"), str):
        upgraded["mono_read"] = current_stamp(old["mono_read"])
    kept = {**old_fingerprints(old), **matched}
    checked = {**old.get("checked", {}), **{form: checked_fingerprint(pipe, name, form) for form in matched}}
    pipe.record(name).write({**upgraded, "fingerprint": stamp, "old_fingerprints": kept, "checked": checked})
    return True


def upgradable(pipe: Pipeline, name: str) -> Optional[tuple[dict, dict[str, str]]]:
    """The stage's record and, by form, each earlier form's fingerprint of these inputs that it
    holds: as its own, or kept by an upgrade made before its upstream stages' (``--only``) and
    with every file as that upgrade saw it (an earlier form stamped fewer of them); None when it
    holds none (read only)."""
    old = pipe.record(name).read()
    if not old or not isinstance(old.get("fingerprint"), str):
        return None
    kept, checked = set(old_fingerprints(old).values()), old.get("checked", {})
    matched = {}
    for form in OLD_STAMPS:
        stamp = old_fingerprint(pipe, name, form)
        own = stamp == old["fingerprint"]
        if own or (stamp in kept and checked.get(form) == checked_fingerprint(pipe, name, form)):
            matched[form] = stamp
    return (old, matched) if matched else None

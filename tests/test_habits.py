"""The house habits a machine can hold (docs/STYLE.md, "Habits").

Commit subjects: at most 72 characters, for every commit made after the rule was written
(merges excluded: their subjects are written by the tool). The test reads the repository's own
history with git, so it runs on any full clone. It skips, saying why, only where that history
cannot be read: no git, a tree that is not a git checkout (an unpacked archive), or a shallow
clone whose history stops before the base commit. A full clone that lacks the base fails: the
history was rewritten, and ``BASE`` must name the rule's commit in the new one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The last commit made before the rule reached every author (issue 30; written beside it, its
# subject has 74 characters): the commits after it are held to the limit, the older ones stay
# as they were.
BASE = "bb2e4cd04dbe8fe43fa1ffa4b582fff648cb584c"
MAX_SUBJECT = 72


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )


def _history_or_skip() -> None:
    """Skip unless git can read this checkout's history back to ``BASE``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the commit history cannot be read")
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
        pytest.skip(f"not a git checkout git can read: {top.stderr.strip() or top.stdout.strip()}")
    if _git("cat-file", "-e", f"{BASE}^{{commit}}").returncode == 0:
        return
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip(f"a shallow clone without the base commit {BASE[:12]}")
    pytest.fail(f"the base commit {BASE} is not in this full clone: set BASE to the rule's commit")


def test_commit_subjects_after_the_rule_fit_72_characters() -> None:
    _history_or_skip()
    log = _git("log", "--no-merges", "--format=%h %s", f"{BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    commits = [line.partition(" ")[::2] for line in log.stdout.splitlines()]
    too_long = [
        f"{commit}: {len(subject)} characters"
        for commit, subject in commits
        if len(subject) > MAX_SUBJECT
    ]
    assert not too_long, (
        f"commit subjects over {MAX_SUBJECT} characters (say what changed in the subject, "
        f"the why in the body; docs/STYLE.md, Habits): {too_long}"
    )

"""The benchmarks' provenance: which commit a result came from."""
import shutil
import subprocess

import pytest

from benchmarks.timing import git_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_a_tree_that_differs_from_its_head_is_marked_dirty(tmp_path):
    """A results file names the commit it ran; a tree whose tracked files differ from HEAD (the
    GPU machine's copy carries a stale .git) reads "<HEAD>+dirty", a clean one the bare short
    hash, and a directory outside any repository "unknown"."""
    assert git_commit(str(tmp_path)) == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "b.py").write_text("untracked\n")  # untracked files are not the commit's
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path)) == head + "+dirty"

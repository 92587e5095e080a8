"""The user guide builds from docs/ with every warning an error
(docs/decisions.md#the-user-guide-is-built-with-mkdocs): what scripts/test.sh runs before pytest,
and proof that a broken link, a broken anchor and a page left out of the nav fail it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` (a directory with mkdocs.yml and docs/) into ``site``."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_the_guide_builds_strict(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "start-sealed-s3" / "index.html").is_file()
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_a_broken_link_a_broken_anchor_and_a_page_out_of_the_nav_fail_the_build(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    runbook = project / "docs" / "runbook.md"
    runbook.write_text(runbook.read_text()
                       + "\n[gone](no-such-page.md) [lost](install.md#no-such-heading)\n")
    (project / "docs" / "stray.md").write_text("# Not in the nav\n")
    done = _build(project, tmp_path / "site")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "contains a link 'no-such-page.md', but the target is not found" in said
    assert "does not contain an anchor '#no-such-heading'" in said
    assert "not included in the \"nav\" configuration:\n  - stray.md" in said
    assert "Aborted with 3 warnings in strict mode" in said

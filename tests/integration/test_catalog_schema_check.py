"""The per-command schema check reads ``alembic_version`` itself, without importing Alembic."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from zrepl_py.catalog import db


def test_the_head_constant_is_the_single_head_of_the_migration_scripts():
    assert db.HEAD_REVISION == db.head_revision()


def test_current_revision_reads_what_alembic_wrote_and_none_before(catalog_url):
    engine = db.make_engine(catalog_url)
    try:
        assert db.current_revision(engine) is None
        db.upgrade(engine)
        assert db.current_revision(engine) == db.HEAD_REVISION
        db.require_current(engine)
    finally:
        engine.dispose()


def test_checking_a_current_catalog_imports_no_alembic(tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    script = textwrap.dedent(f"""
        import sys
        from zrepl_py.catalog import db
        engine = db.make_engine({url!r})
        db.require_current(engine)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "alembic"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"

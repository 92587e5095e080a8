"""What ``zbak replicate`` loads before its prefetch thread starts (zrepl_py.runtime.prefetch): the
command, the config, the alerts and the Context, but not SQLAlchemy, whose import is the
CPU the main thread spends while the prefetch waits on the hosts."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_modules_a_run_loads_before_its_prefetch_import_no_sqlalchemy():
    script = textwrap.dedent("""
        import sys
        import zrepl_py.alerts, zrepl_py.cli, zrepl_py.cli.common, zrepl_py.cli.replicate_cmd
        import zrepl_py.config.loading, zrepl_py.invocation.context, zrepl_py.locking
        print(sorted({m.split(".")[0] for m in sys.modules} & {"sqlalchemy", "alembic"}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"

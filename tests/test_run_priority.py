"""A one-run process (a scheduled replay or reconcile) runs below the streaming service's
priority on a local master (`spark_jobs.session.lower_priority`): checked in fresh processes,
since niceness only goes up."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import os\nfrom lakehouse.settings import Settings\n"
         "from spark_jobs.session import lower_priority\n"
         "before = os.nice(0)\nlower_priority(Settings.from_env())\nprint(os.nice(0) - before)")


def niceness_added(**env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k not in ("RUN_NICENESS", "SPARK_MASTER")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**environ, **env}, cwd=REPO,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_a_run_on_a_local_master_yields_to_the_service():
    assert niceness_added() == max(0, 10 - os.nice(0))
    assert niceness_added(RUN_NICENESS="19") == max(0, 19 - os.nice(0)) > 0


def test_no_change_when_off_or_on_a_cluster():
    assert niceness_added(RUN_NICENESS="0") == 0
    assert niceness_added(SPARK_MASTER="spark://127.0.0.1:7077") == 0

"""The drawing child's niceness: lowered for every thread once it has started, restored
for every thread while the prover waits on a flush and at its close (on Linux niceness
is per thread)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.chaos.faults import child_env, run_python

CODE = r"""
import json, os, threading
from otel_proofscope.rerun import worker

def every():
    return sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")})

stop = threading.Event()
early = threading.Thread(target=stop.wait)  # like the sink's sender: started before
early.start()
start = every()
worker.lower_priority()
late = threading.Thread(target=stop.wait)  # like Rerun's own threads: started after
late.start()
lowered = every()
with worker.waited_on():
    waiting = every()
after_wait = every()
worker.restore_priority()
restored = every()
stop.set()
print(json.dumps({"start": start, "lowered": lowered, "restored": restored,
                  "waiting": waiting, "after_wait": after_wait,
                  "root": os.geteuid() == 0}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness")
def test_every_thread_is_niced_once_started_and_restored_at_the_close() -> None:
    res = run_python(CODE, env=child_env(PROOFSCOPE_RERUN_NICE="7"), timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    base = got["start"]
    assert len(base) == 1
    assert got["lowered"] == [min(base[0] + 7, 19)]
    if got["root"]:  # lowering niceness back needs privilege
        assert got["restored"] == base
        assert got["waiting"] == base  # the prover waits on a flush: full priority
        assert got["after_wait"] == got["lowered"]
    else:  # unprivileged: stays niced, never niced twice
        assert got["waiting"] == got["after_wait"] == got["lowered"]


def test_the_child_is_not_niced_before_it_has_started() -> None:
    code = ("import os; from otel_proofscope.rerun import worker; "
            "worker.child_pipes('test'); "
            "os.write(2, str(os.getpriority(os.PRIO_PROCESS, 0)).encode())")
    res = run_python(code, env=child_env(PROOFSCOPE_RERUN_NICE="7"), timeout=60)
    assert res.returncode == 0
    assert int(res.stderr.strip()) == os.getpriority(os.PRIO_PROCESS, 0)

"""mdv.progress: a forked child SIGKILLed inside tqdm's lock must not hang its siblings or its parent.

tqdm's default lock holds a ``multiprocessing.RLock`` (shared memory, inherited by ``os.fork``); before
mdv gave each forked child its own lock, a child killed mid-refresh left it taken and the next bar of
every other process blocked forever (this hung tests/test_sweep_interrupted.py's random-kill loop in CI).
The scenario runs in a subprocess so that a regression fails with a timeout instead of hanging pytest.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.test_sweep import REPO

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGKILL"),
                                reason="needs POSIX fork and SIGKILL")

SCENARIO = textwrap.dedent(r'''
    import os, signal, sys, time
    import mdv  # registers the at-fork handler
    from tqdm import tqdm
    from tqdm.auto import tqdm as auto_tqdm
    from mdv.progress import progress_bar

    for bar in (tqdm(range(3), file=sys.stderr), auto_tqdm(range(3), file=sys.stderr)):
        list(bar)  # the parent creates tqdm's (shared) lock, as a warm sweep driver does
    pid = os.fork()
    if pid == 0:  # a child killed while it holds the lock
        tqdm.get_lock().acquire()
        auto_tqdm.get_lock().acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    pid = os.fork()
    if pid == 0:  # a sibling makes bars of every kind
        with progress_bar(True, total=3, file=sys.stderr) as bar:
            bar.update(3)
        list(auto_tqdm(range(3), file=sys.stderr))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    list(tqdm(range(3), file=sys.stderr))  # and so does the parent
    print("no process blocked")
''')


def test_a_child_killed_inside_the_bar_lock_blocks_no_other_process() -> None:
    try:
        out = subprocess.run([sys.executable, "-c", SCENARIO], cwd=REPO, capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("a process blocked on tqdm's lock after a forked child was killed holding it")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "no process blocked"

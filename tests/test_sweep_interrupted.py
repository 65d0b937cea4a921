"""Sweeps killed with SIGKILL (no cleanup, no ``finally``) and rerun: every cell exactly once.

The sweeps run in real child processes.  A **driver** (``DRIVER`` below, written to a temp folder and
started once per module as ``python driver.py``) imports mdv, builds the tiny random pair and warms up
with one full sweep; then, per command on its stdin, it **forks** a child that runs
:func:`mdv.sweep.run_sweep` on :func:`tests.test_sweep.tiny_config` (6 cells, the stub dataset) into a
given results folder, and reports the child's pid and, on request, how it ended.  Forking a warm
process keeps each run at a fraction of a second instead of the ~6 s a cold interpreter needs, so the
random-kill loop fits in seconds.  The child wraps ``run_cell``, ``mdv.engine.generate``,
``json.dump`` and ``os.replace`` to

* append ``<tag> start <cell_id>`` to a log when it starts computing a cell, ``<tag> wrote <cell_id>``
  right after a cell file is renamed into place (so recomputations and double writes are counted);
* SIGKILL itself at a chosen point: before prompt P of the N-th computed cell (mid-cell), after half of
  the temp file is written (``half_temp``), with the temp file complete but not renamed
  (``before_replace``), or right after the rename (``after_replace``: the file is done, the cell lock
  and the directory fsync are not).

After every kill the test checks what a reader sees (``cells/*.json``: complete, strict JSON, status
ok, only expected names), snapshots the finished files, reruns, and checks that the snapshot files are
byte-identical with the same mtime, that no cell finished before the rerun was started again, and, at
the end, that every cell file exists exactly once, that no temp, lock or moved-aside file remains, and
that each cell was written exactly once over all runs.  Random kills: a seeded loop that sleeps a random
delay (up to one warm sweep's duration) and SIGKILLs the child, until a run completes.

Also here (in-process): stale temp files of dead writers are removed but those of live processes and
other hosts are kept; a corrupt or foreign cell file is moved aside (not overwritten) with a warning and
a failed record is retried and replaced with a log line; a cell locked by another process is left to
it; two sweeps running at once on one folder (two children) compute every cell exactly once; a file
another sweep wrote while this one computed the cell is kept (this result is discarded); an unwritable
``cells`` folder is an error before any work.
"""
from __future__ import annotations

import json
import logging
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest

import mdv.sweep as sweep
import mdv.sweep.runner as runner
import mdv.sweep.store as store
from mdv.errors import InvalidInputError
from mdv.sweep import expand_grid, read_cell, run_sweep
from tests.test_sweep import REPO, snapshot, stub_format, stub_prompts, tiny_config

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGKILL"),
                                reason="needs POSIX fork and SIGKILL")

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}

DRIVER = r'''
import json, logging, os, signal, sys, time, traceback
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import torch
import mdv.engine
import mdv.sweep as sweep
import mdv.sweep.runner as runner
import mdv.sweep.store as store
from tests.test_sweep import stub_format, stub_prompts, tiny_config

torch.set_num_threads(1)
scratch = Path(sys.argv[2])


def config(cmd):
    return tiny_config(Path(cmd["results_dir"]), **cmd.get("over", {}))


# warm up: build the models (cached in mdv.sweep, inherited by every fork) and time one warm sweep
sweep.run_sweep(tiny_config(scratch / "cold"), loader=stub_prompts, formatter=stub_format)
t0 = time.perf_counter()
sweep.run_sweep(tiny_config(scratch / "warm"), loader=stub_prompts, formatter=stub_format)
warm = time.perf_counter() - t0


def child(cmd):
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log_fd = os.open(cmd["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    kill = cmd.get("kill") or {}
    state = {"cell": 0, "prompt": 0, "cell_id": None}

    def note(*words):
        os.write(log_fd, (" ".join([cmd["tag"], *map(str, words)]) + "\n").encode())

    def die():
        note("kill", state["cell_id"])
        os.kill(os.getpid(), signal.SIGKILL)

    real_run_cell = sweep.run_cell

    def run_cell(cell, *a, **k):
        state.update(cell=state["cell"] + 1, prompt=0, cell_id=cell.cell_id)
        note("start", cell.cell_id)
        if cmd.get("slow"):
            time.sleep(cmd["slow"])
        return real_run_cell(cell, *a, **k)

    real_generate = mdv.engine.generate

    def generate(*a, **k):
        if kill.get("at") == "prompt" and (state["cell"], state["prompt"]) == (kill["cell"], kill["prompt"]):
            die()
        state["prompt"] += 1
        return real_generate(*a, **k)

    real_dump = json.dump

    def dump(obj, f, **kw):
        if kill.get("at") == "half_temp" and state["cell"] == kill["cell"]:
            text = json.dumps(obj, **kw)
            f.write(text[: len(text) // 2])
            f.flush()
            os.fsync(f.fileno())
            die()
        return real_dump(obj, f, **kw)

    real_replace = os.replace

    def replace(src, dst, *a, **k):
        is_cell = str(dst).endswith(".json")
        mine = is_cell and state["cell"] == kill.get("cell")
        if mine and kill.get("at") == "before_replace":
            die()
        real_replace(src, dst, *a, **k)
        if is_cell:
            note("wrote", Path(dst).name[: -len(".json")])
        if mine and kill.get("at") == "after_replace":
            die()

    runner.run_cell, mdv.engine.generate, json.dump, os.replace = run_cell, generate, dump, replace
    report = sweep.run_sweep(config(cmd), loader=stub_prompts, formatter=stub_format)
    out = {k: getattr(report, k) for k in ("cells", "skipped", "ok", "failed", "busy", "moved_aside")}
    Path(cmd["report"]).write_text(json.dumps(out))


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


reply({"ready": warm, "host": store._HOST})
while True:
    line = sys.stdin.readline()
    if not line:
        break
    cmd = json.loads(line)
    if cmd["op"] == "start":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(cmd["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                child(cmd)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        reply({"pid": pid})
    elif cmd["op"] == "wait":
        _, status = os.waitpid(cmd["pid"], 0)
        reply({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
               "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None})
'''


class Driver:
    """The warm driver process (see the module docstring) and its line protocol."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.runs = 0
        script = workdir / "driver.py"
        script.write_text(DRIVER)
        self.err_path = workdir / "driver.err"
        self._err = open(self.err_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(script), str(REPO), str(workdir / "scratch")], cwd=REPO,
                                     env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._buf = b""
        hello = self._read(timeout=120)
        self.warm_seconds: float = hello["ready"]
        self.host: str = hello["host"]

    def _read(self, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                last = self.workdir / f"r{self.runs}.out"  # the newest child's output, where a hang shows
                raise AssertionError(f"the driver did not answer (timeout or exit); its stderr:\n"
                                     f"{self.err_path.read_text()[-3000:]}\nr{self.runs}'s output:\n"
                                     f"{last.read_text()[-3000:] if last.exists() else ''}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _send(self, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()
        return self._read()

    def start(self, results_dir: Path, log: Path, kill: Optional[dict[str, Any]] = None, slow: float = 0.0,
              over: Optional[dict[str, Any]] = None) -> "Run":
        self.runs += 1
        tag = f"r{self.runs}"
        run = Run(self, tag, results_dir, log, self.workdir / f"{tag}.out", self.workdir / f"{tag}.report.json")
        run.pid = self._send({"op": "start", "tag": tag, "results_dir": str(results_dir), "log": str(log),
                              "out": str(run.out), "report": str(run.report_path), "kill": kill, "slow": slow,
                              "over": over or {}})["pid"]
        return run

    def run(self, results_dir: Path, log: Path, **kw: Any) -> "Run":
        return self.start(results_dir, log, **kw).wait()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


class Run:
    """One child sweep: its tag in the log, pid, and (after :meth:`wait`) how it ended."""

    def __init__(self, driver: Driver, tag: str, results_dir: Path, log: Path, out: Path, report_path: Path):
        self.driver, self.tag, self.results_dir, self.log = driver, tag, results_dir, log
        self.out, self.report_path = out, report_path
        self.pid = -1
        self.signal: Optional[int] = None
        self.code: Optional[int] = None

    def wait(self) -> "Run":
        res = self.driver._send({"op": "wait", "pid": self.pid})
        self.signal, self.code = res["signal"], res["code"]
        return self

    @property
    def killed(self) -> bool:
        return self.signal == signal.SIGKILL

    @property
    def completed(self) -> bool:
        return self.code == 0

    @property
    def report(self) -> dict[str, Any]:
        assert self.code == 0, f"{self.tag} ended with signal {self.signal} / code {self.code}:\n{self.output}"
        return json.loads(self.report_path.read_text())

    @property
    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def events(self, kind: str) -> list[str]:
        """Cell ids of this run's log entries of ``kind`` (start / wrote / kill), in order."""
        if not self.log.exists():
            return []
        rows = [line.split(" ", 2) for line in self.log.read_text().splitlines()]
        return [r[2] for r in rows if r[0] == self.tag and r[1] == kind]


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Any:
    d = Driver(tmp_path_factory.mktemp("driver"))
    yield d
    d.close()


# ------------------------------------------------------------------------------- what every check needs
def expected_ids(results_dir: Path, over: Optional[dict[str, Any]] = None) -> list[str]:
    return [c.cell_id for c in expand_grid(tiny_config(results_dir, **(over or {})))]


def strict(path: Path) -> dict[str, Any]:
    def bad(c: str) -> None:
        raise AssertionError(f"{path.name} holds the non-JSON constant {c}")

    return json.loads(path.read_bytes(), parse_constant=bad)


def check_visible(results_dir: Path, expected: list[str]) -> dict[str, tuple[int, bytes]]:
    """What a reader globbing cells/*.json sees: only expected names, each complete strict JSON with status
    ok; -> the snapshot (mtime_ns, bytes) of those files."""
    files = sorted((results_dir / "cells").glob("*.json"))
    for p in files:
        cid = p.name[: -len(".json")]
        assert cid in expected, f"unexpected result file {p.name}"
        rec = strict(p)  # raises on a truncated or torn file
        assert rec["schema"] == "mdv.cell/1" and rec["cell_id"] == cid and rec["status"] == "ok", p.name
        assert [g["prompt_index"] for g in rec["generations"]] == [0, 1], p.name
    return snapshot(results_dir)


def check_complete(results_dir: Path, expected: list[str], runs: list[Run]) -> None:
    """Every cell file exactly once, complete; nothing else left in cells/; each cell written once."""
    cells = results_dir / "cells"
    check_visible(results_dir, expected)
    assert sorted(p.name for p in cells.glob("*.json")) == sorted(f"{c}.json" for c in expected)
    leftovers = sorted(p.name for p in cells.iterdir() if not p.name.endswith(".json") or p.name.startswith("."))
    assert leftovers == [], f"temp, lock or moved-aside files left behind: {leftovers}"
    writes = Counter(c for r in runs for c in r.events("wrote"))
    assert all(n <= 1 for n in writes.values()), f"a cell file was written twice: {writes}"


def check_rerun(before: dict[str, tuple[int, bytes]], rerun: Run) -> None:
    """Files finished before ``rerun`` are untouched (bytes and mtime) and none of them was started again."""
    after = snapshot(rerun.results_dir)
    assert {k: after.get(k) for k in before} == before, "a finished file was rewritten"
    again = {c for c in rerun.events("start") if f"{c}.json" in before}
    assert not again, f"finished cells computed again: {sorted(again)}"


def temp_files(results_dir: Path) -> list[Path]:
    return sorted((results_dir / "cells").glob(".*.tmp"))


# ------------------------------------------------------------------------------- deterministic kills
def test_sigkill_in_the_middle_of_a_cell_then_rerun(driver: Driver, tmp_path: Path) -> None:
    res, log = tmp_path / "results", tmp_path / "log"
    ids = expected_ids(res)
    first = driver.run(res, log, kill={"at": "prompt", "cell": 3, "prompt": 1})  # 3rd cell, 2nd prompt
    assert first.killed, first.output
    assert first.events("start") == ids[:3] and first.events("wrote") == ids[:2] and first.events("kill") == [ids[2]]
    before = check_visible(res, ids)
    assert sorted(before) == sorted(f"{c}.json" for c in ids[:2])
    assert (res / "cells" / f".{ids[2]}.lock").exists()  # the dead owner's lock is left; the kernel released it
    assert temp_files(res) == []

    second = driver.run(res, log)
    assert second.completed, second.output
    rep = second.report
    assert rep["skipped"] == ids[:2] and rep["ok"] == ids[2:] and not rep["failed"] and not rep["busy"]
    assert second.events("start") == ids[2:]  # the killed cell once more, then the rest; nothing finished
    check_rerun(before, second)
    check_complete(res, ids, [first, second])


@pytest.mark.parametrize("at", ["half_temp", "before_replace", "after_replace"])
def test_sigkill_during_a_result_write_then_rerun(driver: Driver, tmp_path: Path, at: str) -> None:
    res, log = tmp_path / "results", tmp_path / "log"
    ids = expected_ids(res)
    victim = ids[1]
    first = driver.run(res, log, kill={"at": at, "cell": 2})
    assert first.killed and first.events("kill") == [victim], first.output
    tmp = res / "cells" / f".{victim}.json.{first.pid}@{driver.host}.tmp"
    before = check_visible(res, ids)  # never a torn file under a *.json name
    if at == "after_replace":
        assert sorted(before) == sorted(f"{c}.json" for c in ids[:2]) and temp_files(res) == []
        assert (res / "cells" / f".{victim}.lock").exists()
    else:
        assert sorted(before) == [f"{ids[0]}.json"]
        assert temp_files(res) == [tmp]  # what the killed write left behind
        text = tmp.read_text()
        if at == "half_temp":
            with pytest.raises(ValueError):
                json.loads(text)
        else:
            assert json.loads(text)["cell_id"] == victim

    second = driver.run(res, log)
    assert second.completed, second.output
    check_rerun(before, second)
    if at == "after_replace":  # the file was complete: the cell counts as done
        assert second.events("start") == ids[2:] and second.report["skipped"] == ids[:2]
    else:
        assert second.events("start") == ids[1:] and second.report["ok"] == ids[1:]
        assert "removed 1 temp file(s) left by interrupted writes of dead processes" in second.output
        assert tmp.name in second.output
    check_complete(res, ids, [first, second])


def test_sigkill_at_random_moments_until_done(driver: Driver, tmp_path: Path) -> None:
    """12 cells; seeded random delays of up to half a warm 6-cell sweep, so that a run is usually killed
    after a few cells (anywhere: computing, writing, starting up); every run resumes the previous one."""
    res, log = tmp_path / "results", tmp_path / "log"
    over = {"method.names": ["ar", "sd", "bv", "gbv", "spectr", "mdbv"]}
    ids = expected_ids(res, over)
    assert len(ids) == 12
    rng = random.Random(20260606)
    runs: list[Run] = []
    kills = 0
    before: dict[str, tuple[int, bytes]] = {}
    t_end = time.monotonic() + 30
    for attempt in range(40):
        run = driver.start(res, log, over=over)
        if attempt < 35 and time.monotonic() < t_end:  # bounded: the last tries run to completion
            time.sleep(rng.uniform(0.0, 0.5 * driver.warm_seconds))
            os.kill(run.pid, signal.SIGKILL)  # a child that already exited is a zombie until waited for
        run.wait()
        runs.append(run)
        assert run.killed or run.completed, f"{run.tag}: signal {run.signal}, code {run.code}\n{run.output}"
        check_rerun(before, run)
        before = check_visible(res, ids)
        if run.completed:
            break
        kills += 1
    else:
        pytest.fail(f"no run completed in {len(runs)} tries")
    print(f"random kills: {kills} kills in {len(runs)} runs (warm 6-cell sweep {driver.warm_seconds:.2f} s);"
          f" cells started per run {[len(r.events('start')) for r in runs]}")
    assert kills >= 3, f"only {kills} run(s) killed: the random delays rarely hit a running sweep"
    check_complete(res, ids, runs)
    assert set(runs[-1].report["skipped"]) | set(runs[-1].report["ok"]) == set(ids)
    starts = Counter(c for r in runs for c in r.events("start"))
    assert set(starts) == set(ids)  # each started at least once; more only when killed before its file


# ------------------------------------------------------------------------------- concurrent sweeps
def test_two_sweeps_on_one_folder_compute_each_cell_once(driver: Driver, tmp_path: Path) -> None:
    res, log = tmp_path / "results", tmp_path / "log"
    ids = expected_ids(res)
    a = driver.start(res, log, slow=0.25)  # slow cells: the two sweeps surely overlap
    b = driver.start(res, log, slow=0.25)
    a.wait(), b.wait()
    assert a.completed and b.completed, a.output + b.output
    ra, rb = a.report, b.report
    starts = Counter(a.events("start") + b.events("start"))
    assert starts == Counter(ids), f"cells computed twice or never: {starts}"
    assert set(ra["ok"]).isdisjoint(rb["ok"]) and set(ra["ok"]) | set(rb["ok"]) == set(ids)
    assert ra["ok"] and rb["ok"], "one sweep computed everything: they did not run at the same time"
    for r in (ra, rb):  # what a sweep did not compute, the other one held (busy) or had finished (skipped)
        assert set(r["busy"]) | set(r["skipped"]) == set(ids) - set(r["ok"])
    check_complete(res, ids, [a, b])


def test_cell_locked_by_another_process_is_left_to_it(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, **{"dataset.names": ["humaneval"]})
    ids = [c.cell_id for c in expand_grid(cfg)]
    sweep.prepare_results_dir(tmp_path)
    held = sweep.lock_cell(tmp_path, ids[1])  # a second open file: conflicts like another process would
    assert held is not None and held.fd is not None
    assert sweep.lock_cell(tmp_path, ids[1]) is None
    try:
        first = run_sweep(cfg, loader=stub_prompts, formatter=stub_format)
    finally:
        held.release()
    assert first.busy == [ids[1]] and first.ok == [ids[0], ids[2]]
    assert not (tmp_path / "cells" / f"{ids[1]}.json").exists()
    assert "1 left to another running sweep (busy)" in first.line()
    # a lock file nobody holds (its process died) is taken over
    (tmp_path / "cells" / f".{ids[1]}.lock").write_text("12345@elsewhere\n")
    second = run_sweep(cfg, loader=stub_prompts, formatter=stub_format)
    assert second.ok == [ids[1]] and second.skipped == [ids[0], ids[2]] and not second.busy
    assert not [p.name for p in (tmp_path / "cells").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------- leftovers and existing files
def test_only_temp_files_of_dead_local_writers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = store._HOST
        names = {"dead": f".a.json.{dead.pid}@{host}.tmp", "old_format_dead": f".b.json.{dead.pid}.tmp",
                 "probe_dead": f".write-probe.{dead.pid}@{host}.tmp", "live": f".c.json.{live.pid}@{host}.tmp",
                 "mine": f".d.json.{os.getpid()}@{host}.tmp", "other_host": f".e.json.{dead.pid}@not-{host}.tmp",
                 "unrelated": "notes.tmp", "result": "f.json"}
        for n in names.values():
            (tmp_path / n).write_text("{")
        removed = sweep.remove_stale_temp_files(tmp_path)
        assert sorted(p.name for p in removed) == sorted(names[k] for k in ("dead", "old_format_dead", "probe_dead"))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            names[k] for k in ("live", "mine", "other_host", "unrelated", "result"))
    finally:
        live.kill()
        live.wait()


def test_corrupt_or_foreign_file_is_moved_aside_and_a_failed_record_is_replaced(tmp_path: Path, caplog) -> None:
    cfg = tiny_config(tmp_path, **{"dataset.names": ["humaneval"]})
    ids = [c.cell_id for c in expand_grid(cfg)]
    run_sweep(cfg, loader=stub_prompts, formatter=stub_format)
    cells = tmp_path / "cells"
    torn = b'{"schema": "mdv.cell/1", "cell_id": "' + ids[0].encode() + b'", "status": "ok", "gen'
    (cells / f"{ids[0]}.json").write_bytes(torn)
    foreign = (cells / f"{ids[2]}.json").read_bytes()  # another cell's complete record under ids[1]'s name
    (cells / f"{ids[1]}.json").write_bytes(foreign)
    rec = read_cell(cells / f"{ids[2]}.json")
    assert rec is not None
    rec.update(status="failed", error="RuntimeError: boom", generations=[], summary={})
    sweep.write_json_atomic(cells / f"{ids[2]}.json", rec)

    with caplog.at_level(logging.INFO, logger="mdv.sweep"):
        report = run_sweep(cfg, loader=stub_prompts, formatter=stub_format)
    assert report.ok == ids and not report.skipped
    for cid, old in ((ids[0], torn), (ids[1], foreign)):
        aside = list(cells.glob(f"{cid}.json.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == old  # kept, byte for byte
        assert str(aside[0]) in report.moved_aside
        assert any(r.levelno == logging.WARNING and f"{cid}.json" in r.getMessage() and aside[0].name in r.getMessage()
                   for r in caplog.records), f"no warning names {cid}.json"
    assert len(report.moved_aside) == 2 and "2 unreadable file(s) moved aside" in report.line()
    assert not list(cells.glob(f"{ids[2]}.json.corrupt-*"))  # a failed record is retried, not moved aside
    assert any(ids[2] in r.getMessage() and "failed record (RuntimeError: boom) will be replaced" in r.getMessage()
               for r in caplog.records)
    for cid in ids:
        new = read_cell(cells / f"{cid}.json")
        assert new is not None and new["status"] == "ok" and new["cell_id"] == cid


def test_a_file_written_meanwhile_by_another_sweep_is_not_overwritten(tmp_path: Path, monkeypatch, caplog) -> None:
    """Without a working lock (e.g. a filesystem without flock), another sweep may finish a cell while this
    one computes it: its complete file is kept and this result is discarded, with a warning."""
    over = {"dataset.names": ["humaneval"]}
    ids = [c.cell_id for c in expand_grid(tiny_config(tmp_path / "a", **over))]
    run_sweep(tiny_config(tmp_path / "a", **over), loader=stub_prompts, formatter=stub_format)
    theirs = (tmp_path / "a" / "cells" / f"{ids[1]}.json").read_bytes()
    real_run_cell = sweep.run_cell

    def other_sweep_finishes_it(cell: Any, *a: Any, **k: Any) -> Any:
        if cell.cell_id == ids[1]:
            (tmp_path / "b" / "cells" / f"{ids[1]}.json").write_bytes(theirs)
        return real_run_cell(cell, *a, **k)

    monkeypatch.setattr(runner, "run_cell", other_sweep_finishes_it)
    with caplog.at_level(logging.WARNING, logger="mdv.sweep"):
        report = run_sweep(tiny_config(tmp_path / "b", **over), loader=stub_prompts, formatter=stub_format)
    assert report.ok == [ids[0], ids[2]] and report.skipped == [ids[1]] and not report.moved_aside
    assert (tmp_path / "b" / "cells" / f"{ids[1]}.json").read_bytes() == theirs
    assert any(ids[1] in r.getMessage() and "result is discarded" in r.getMessage() for r in caplog.records)


def test_unwritable_cells_folder_fails_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "cells").write_text("a file where the cells folder should be")
    calls: list[str] = []

    def loader(name: str, n: int, source: str = "auto") -> Any:
        calls.append(name)
        return stub_prompts(name, n, source)

    with pytest.raises(InvalidInputError, match=r"results_dir/cells .* is not writable.*pass a writable folder"):
        run_sweep(tiny_config(tmp_path), loader=loader, formatter=stub_format)
    assert calls == [] and (tmp_path / "cells").read_text().startswith("a file")

"""Real multiruns through Hydra's launchers, not just their config composition: the joblib launcher
(``hydra/launcher=processes``), the submitit local launcher, and SLURM (``hydra/launcher=slurm``) on a
single-node cluster this test starts itself -- one job cancelled with ``scancel`` in the middle of its
cells, the same command rerun, every cell then on disk exactly once and the cells finished before the
cancel untouched.

The SLURM test needs ``slurm-wlm`` and ``munge`` (``scripts/test.sh`` installs them with apt-get when run as
root) and root to start ``munged``, ``slurmctld`` and ``slurmd``; where it cannot start a cluster it skips
with the reason."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
       "OMP_NUM_THREADS": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)


def multirun(results: Path, launcher: list[str], *, methods: str = "[ar,sd]", prompts: int = 2,
             tokens: int = 5) -> list[str]:
    """A multirun with one job per dataset (humaneval, gsm8k): the AR cell and each method at L = 2 and 3
    (3 cells per job with the default methods)."""
    return [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "models=tiny_random",
            f"method.names={methods}", "dataset=humaneval,gsm8k", "sweep.L=[2,3]", f"dataset.n_prompts={prompts}",
            f"sampling.max_new_tokens={tokens}", "dataset.loader=tests.test_sweep:stub_prompts",
            "dataset.formatter=tests.test_sweep:stub_format", "threads=1", "progress=false",
            f"results_dir={results}", f"hydra.sweep.dir={results / 'multirun'}", *launcher]


def cells(results: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((results / "cells").glob("*.json"))}


def check_every_cell_once(results: Path, n: int) -> None:
    found = cells(results)
    assert len(found) == n, sorted(found)
    assert all(c["status"] == "ok" for c in found.values())
    assert {c["config"]["dataset"] for c in found.values()} == {"humaneval", "gsm8k"}
    # nothing half-written or left over: no temp files, no quarantined copies
    assert not [p.name for p in (results / "cells").iterdir() if p.suffix != ".json" and not p.name.endswith(".lock")]


def test_joblib_launcher_multirun(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="hydra-joblib-launcher is not installed")
    res = tmp_path / "res"
    proc = subprocess.run(multirun(res, ["hydra/launcher=processes", "hydra.launcher.n_jobs=2"]), cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_every_cell_once(res, 6)


def test_submitit_local_launcher_multirun(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    res = tmp_path / "res"
    proc = subprocess.run(multirun(res, ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                                         "hydra.launcher.cpus_per_task=1", "hydra.launcher.gpus_per_node=0"]),
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_every_cell_once(res, 6)
    assert list((res / "multirun" / ".submitit").glob("*/*_result.pkl"))  # the jobs really went through submitit


# ----------------------------------------------------------------------------------------------- SLURM
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ok(cmd: list[str], **kw) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30, **kw).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A single-node SLURM cluster on this machine (its own slurm.conf, ports and state folders); -> the
    environment that points sbatch / squeue / scancel at it."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    tools = ["sbatch", "squeue", "scancel", "sinfo", "scontrol", "slurmctld", "slurmd", "munged", "munge"]
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"SLURM is not installed here (missing {', '.join(missing)}; Debian: apt-get install slurm-wlm"
                    " munge -- scripts/test.sh does it when run as root)")
    if os.geteuid() != 0:
        pytest.skip("starting munged, slurmctld and slurmd needs root here")
    if not _ok(["sh", "-c", "munge -n | unmunge"]):
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "-c", "-f"], capture_output=True)
        for d in ("/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"):
            Path(d).mkdir(parents=True, exist_ok=True)
            shutil.chown(d, "munge", "munge")
        if key.exists():
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        subprocess.run(["munged", "--force"], capture_output=True)
        if not _ok(["sh", "-c", "munge -n | unmunge"]):
            pytest.skip("munged does not start here (no munge credential), so SLURM cannot authenticate")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "log"):
        (root / d).mkdir()
    host = socket.gethostname().split(".")[0]
    mem = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 20 * 0.8)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=mdvtest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        # no cgroups: plain process tracking, no task containment
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none",
        # scancel sends SIGTERM (submitit lets its jobs run on through it), then SIGKILL after KillWait: 2 s
        # here instead of 30 (the cancel test also kills the job's processes itself, so it dies mid-cells)
        "KillWait=2",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory={mem} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**ENV, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen([d, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True) for d in ("slurmctld", "slurmd")]
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.split()
            if out and out[0].startswith("idle"):
                break
            time.sleep(1)
        else:
            log = "\n".join((root / "log" / f).read_text()[-600:] for f in ("slurmctld.log", "slurmd.log")
                            if (root / "log" / f).exists())
            pytest.skip(f"the single-node SLURM cluster did not come up within 60 s here: {log}")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
        for p in daemons:
            os.killpg(p.pid, signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _queue(env: dict[str, str]) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %t"], env=env, capture_output=True, text=True).stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def test_slurm_multirun_survives_a_cancelled_job(slurm: dict[str, str], tmp_path: Path) -> None:
    res = tmp_path / "res"
    # one job at a time (humaneval first, then gsm8k), 7 cells each (AR, then sd, bv, gbv at L = 2 and 3;
    # 8 prompts of 128 tokens, about two seconds a cell): the cancel lands in the middle of the first job
    launcher = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
                "hydra.launcher.gpus_per_node=null", "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=10",
                "hydra.launcher.array_parallelism=1"]
    cmd = multirun(res, launcher, methods="[ar,sd,bv,gbv]", prompts=8, tokens=128)  # ~2 s a cell: the cancel lands midway on a fast VM too
    first = subprocess.Popen(cmd, cwd=REPO, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cancelled, before = None, {}
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        mine = [k for k in (cells(res) if (res / "cells").is_dir() else {}) if k.startswith("humaneval__")]
        running = [j for j, state in _queue(slurm) if state == "R"]
        if 2 <= len(mine) <= 5 and running:  # the first job is in the middle of its cells
            cancelled = running[0]
            # kill -9 every process of the job, then cancel it: a plain scancel sends SIGTERM, which submitit lets
            # its job run on through, and SIGKILL lands only seconds later, in which a fast VM finished every
            # cell of the job (~0.75 s each; CI at bfe2446)
            job_id = subprocess.run(["squeue", "-h", "-j", cancelled, "-o", "%A"], env=slurm, capture_output=True,
                                    text=True).stdout.strip()  # the array task's own numeric id
            listed = subprocess.run(["scontrol", "listpids", job_id], env=slurm, capture_output=True, text=True)
            for line in listed.stdout.splitlines()[1:]:
                pid = line.split()[0] if line.split() else ""
                if pid.isdigit():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            subprocess.run(["scancel", cancelled], env=slurm, check=True)
            before = {k: (res / "cells" / f"{k}.json").read_bytes() for k in cells(res)}
            break
        time.sleep(0.1)
    assert cancelled is not None, "no job was seen running in the middle of its cells"
    deadline = time.time() + 300
    while _queue(slurm) and time.time() < deadline:  # the cancelled job dies; the other one runs
        time.sleep(1)
    assert not _queue(slurm), _queue(slurm)
    # Without SLURM accounting (no slurmdbd here) submitit cannot learn that a job was cancelled and the
    # launcher waits for it forever; stop it, as a user would stop a hung command, once the queue is empty.
    if first.poll() is None:
        first.terminate()
    first.communicate(timeout=60)
    partial = cells(res)
    done_first = [k for k in partial if k.startswith("humaneval__")]
    assert 2 <= len(done_first) < 7, f"the cancel did not stop the first job midway: {sorted(partial)}"
    second = subprocess.run(cmd, cwd=REPO, env=slurm, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    # every cell exactly once, all ok; the cells finished before the cancel byte for byte as they were
    found = cells(res)
    assert len(found) == 2 * 7 and all(c["status"] == "ok" for c in found.values()), sorted(found)
    assert {k: (res / "cells" / f"{k}.json").read_bytes() for k in before} == before
    assert not [p.name for p in (res / "cells").iterdir() if p.name.endswith(".tmp")]

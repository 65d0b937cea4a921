"""The installable ``mdv`` command: build the wheel, install it into a fresh venv in a temp folder, and run
``mdv theory`` (a tiny grid) and ``mdv run`` (the tiny_random pair) from a folder outside the repository.

No network: the wheel is built without build isolation, installed with ``--no-deps --no-index``, and the
fresh venv reaches the already-installed dependencies (torch, transformers, ...) through a ``.pth`` line
naming this interpreter's site folders -- a ``.pth`` path line does not run the ``.pth`` files inside it,
so mdv's own editable install there is not seen: ``mdv`` comes from the wheel."""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for rel in ("pyproject.toml", "README.md", "constraints.txt"):
        if (REPO / rel).exists():
            shutil.copy(REPO / rel, src / rel)
    shutil.copytree(REPO / "mdv", src / "mdv", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(dist.glob("mdv-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path_factory.mktemp("venv") / "fresh"
    proc = subprocess.run([sys.executable, "-m", "venv", str(env_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    Path(purelib, "mdv_test_dependencies.pth").write_text("\n".join(sorted(p for p in here if Path(p).is_dir())) + "\n")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheels[0])],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return env_dir


def _mdv(venv: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"})
    return subprocess.run([str(venv / "bin" / "mdv"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_wheel_ships_the_configs_the_draft_and_the_kernel_source(venv: Path, tmp_path: Path) -> None:
    code = ("import json, mdv, pathlib; root = pathlib.Path(mdv.__file__).parent;"
            " print(json.dumps([str(root), (root / 'conf' / 'config.yaml').is_file(),"
            " (root / 'conf' / 'hydra' / 'launcher' / 'slurm.yaml').is_file(),"
            " any((root / 'assets_data').glob('*.safetensors')),"
            " all((root / 'models' / 'kernels' / c).is_file() for c in ('panel_linear.c', 'lean_layer.c'))"
            " and (root / 'verify' / 'kernels' / 'verify_loops.c').is_file()]))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    root, config, launcher, draft, kernel = json.loads(proc.stdout)
    assert Path(root).is_relative_to(venv) and not Path(root).is_relative_to(REPO)  # mdv from the wheel
    assert config and launcher and draft and kernel  # the C sources compile from the wheel too


def test_mdv_help_and_an_unknown_command(venv: Path, tmp_path: Path) -> None:
    proc = _mdv(venv, ["--help"], tmp_path)
    assert proc.returncode == 0 and all(c in proc.stdout for c in ("run", "theory", "bench", "report", "assets"))
    proc = _mdv(venv, ["frobnicate"], tmp_path)
    assert proc.returncode == 2 and "unknown mdv command 'frobnicate'" in proc.stderr


def test_mdv_theory_from_outside_the_repository(venv: Path, tmp_path: Path) -> None:
    proc = _mdv(venv, ["theory", "K=[1,2]", "L=[1]", "seeds=[0]", "temperatures=[1.0]", "methods=[sd,spectr]",
                       f"hydra.run.dir={tmp_path / 'theory'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "theory" / "theory.md").is_file()
    rows = (tmp_path / "theory" / "theory.csv").read_text().strip().splitlines()
    assert len(rows) > 1 and "spectr" in "".join(rows)


def test_mdv_run_and_report_on_the_tiny_pair_from_outside_the_repository(venv: Path, tmp_path: Path) -> None:
    res = tmp_path / "res"
    proc = _mdv(venv, ["run", "models=tiny_random", "method.names=[ar,sd]", "dataset=humaneval", "dataset.n_prompts=2",
                       "sweep.L=[2]", "sampling.max_new_tokens=6", "threads=1", "progress=false",
                       f"results_dir={res}"], tmp_path)
    if "could not load" in proc.stderr and "humaneval" in proc.stderr:  # pragma: no cover - assets absent
        pytest.fail(f"the humaneval offline asset is missing (run scripts/setup.sh): {proc.stderr[-500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 cells: 2 run" in proc.stdout
    cells = [json.loads(p.read_text()) for p in (res / "cells").glob("*.json")]
    assert sorted(c["config"]["method"] for c in cells) == ["ar", "sd"] and all(c["status"] == "ok" for c in cells)
    proc = _mdv(venv, ["report", str(res)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (res / "analysis" / "report.md").is_file()

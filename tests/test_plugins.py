"""Third-party verifiers and drafters: a plug-in package, installed with pip, registers a verifier through
the ``mdv.verifiers`` entry-point group and a drafter through ``mdv.drafters``; the verifier then runs in a
sweep, the paired measurement and the audit, the drafter in ``mdv.generate`` and a sweep, without any edit
to mdv.  Also the self-filling registries' own rules (built-ins by discovery, refusals)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mdv.errors import InvalidInputError
from mdv.sweep.config import Method, method_names
from mdv.verify.base import Verifier
from mdv.verify.registry import VERIFIERS, register_verifier
from mdv.verify.sd import SpeculativeSampling

REPO = Path(__file__).resolve().parent.parent
BUILTINS = ["bv", "gbv", "mdbv", "mpbv", "sd", "select_gbv", "spectr", "spectr_gbv"]

PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "mdv-demo-plugin"
        version = "0.1.0"

        [project.entry-points."mdv.verifiers"]
        demo_sd = "mdv_demo_plugin:DemoSD"
        broken = "mdv_demo_plugin:NoSuchRule"

        [project.entry-points."mdv.drafters"]
        demo_lookup = "mdv_demo_plugin:DemoLookup"
        """,
    "mdv_demo_plugin/__init__.py": '''
        """A user's verifier and drafter outside mdv: token-level speculative sampling and prompt lookup
        under other names."""
        from mdv.drafters.ngram import NgramDrafter
        from mdv.verify.sd import SpeculativeSampling


        class DemoSD(SpeculativeSampling):
            name = "demo_sd"


        class DemoLookup(NgramDrafter):
            name = "demo_lookup"
        ''',
}


def test_builtins_fill_the_registry_and_every_list_derives_from_it() -> None:
    assert list(VERIFIERS)[:8] == BUILTINS
    assert [m.value for m in Method][:9] == ["ar", *BUILTINS]
    # the preset lists of mdv/conf/method, from the classes' own flags
    assert method_names("lossless")[:8] == ["ar", "bv", "gbv", "mdbv", "mpbv", "sd", "select_gbv", "spectr"]
    assert method_names("multi_draft")[:7] == ["ar", "mdbv", "mpbv", "sd", "select_gbv", "spectr", "spectr_gbv"]
    with pytest.raises(InvalidInputError, match="unknown method list 'fast'"):
        method_names("fast")


def test_register_refuses_a_taken_name_and_a_non_verifier() -> None:
    class Impostor(SpeculativeSampling):
        name = "sd"

    with pytest.raises(InvalidInputError, match="'sd' .* already taken by mdv.verify.sd.SpeculativeSampling"):
        register_verifier(Impostor)
    assert register_verifier(SpeculativeSampling) is SpeculativeSampling  # the same class again: a no-op
    with pytest.raises(InvalidInputError, match="not a subclass"):
        register_verifier(dict)

    class Baseline(Verifier):
        name = "ar"

    with pytest.raises(InvalidInputError, match="'ar' is the autoregressive baseline"):
        register_verifier(Baseline)
    assert VERIFIERS["sd"] is SpeculativeSampling and "ar" not in VERIFIERS


def test_builtin_drafters_fill_their_registry_and_register_refuses_what_it_must() -> None:
    from mdv.drafters import DRAFTERS, Drafter, register_drafter
    from mdv.drafters.ngram import NgramDrafter
    from mdv.sweep.config import drafter_names

    assert list(DRAFTERS)[:4] == ["eagle", "layerskip", "model", "ngram"] and drafter_names("all")[:4] == list(DRAFTERS)[:4]

    class Impostor(NgramDrafter):
        name = "model"

    with pytest.raises(InvalidInputError, match="'model' .* already taken by mdv.drafters.model.ModelDrafter"):
        register_drafter(Impostor)
    with pytest.raises(InvalidInputError, match="register_drafter: .* is not a subclass of mdv.drafters.base.Drafter"):
        register_drafter(SpeculativeSampling)
    assert register_drafter(NgramDrafter) is NgramDrafter and DRAFTERS["model"] is not Impostor
    assert issubclass(DRAFTERS["ngram"], Drafter)


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The plug-in package installed by pip into a folder of its own (no index, no network)."""
    src = tmp_path_factory.mktemp("plugin-src")
    for rel, text in PLUGIN.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(textwrap.dedent(text).lstrip())
    site = tmp_path_factory.mktemp("plugin-site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--no-build-isolation", "--target", str(site), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(site.glob("mdv_demo_plugin-*.dist-info/entry_points.txt"))
    return site


def _run(site: Path, args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_plugin_is_registered_and_a_broken_one_skipped(plugin_site: Path) -> None:
    code = ("import json; from mdv.verify import VERIFIERS; from mdv.sweep.config import Method, method_names;"
            " import mdv.engine as e; print(json.dumps([list(VERIFIERS), [m.value for m in Method],"
            " method_names('lossless'), e.valid_methods()]))")
    proc = _run(plugin_site, ["-c", code])
    assert proc.returncode == 0, proc.stderr
    verifiers, methods, lossless, valid = json.loads(proc.stdout)
    assert verifiers == [*BUILTINS, "demo_sd"]  # plug-ins after the built-ins
    assert methods == valid == ["ar", *BUILTINS, "demo_sd"]
    assert "demo_sd" in lossless  # its class says lossless (it inherits sd's flag)
    # the broken entry point: one warning naming it, and mdv still works
    warned = [line for line in proc.stderr.splitlines() if "plug-in" in line]
    assert len(warned) == 1 and "'broken'" in warned[0] and "mdv_demo_plugin:NoSuchRule" in warned[0], proc.stderr


def test_a_plugin_verifier_runs_in_a_sweep(plugin_site: Path, tmp_path: Path) -> None:
    res = tmp_path / "res"
    proc = _run(plugin_site, [
        "-m", "experiments.run", "models=tiny_random", "method.names=[ar,sd,demo_sd]", "dataset=humaneval",
        "dataset.n_prompts=2", "sweep.K=[1]", "sweep.L=[3]", "sampling.temperatures=[0.7]",
        "sampling.max_new_tokens=8", "dataset.loader=tests.test_sweep:stub_prompts",
        "dataset.formatter=tests.test_sweep:stub_format", "threads=1", "progress=false", f"results_dir={res}"],
        cwd=tmp_path)  # outside the repository: mdv and the plug-in come from the import path
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 cells: 3 run" in proc.stdout
    cells = {json.loads(p.read_text())["config"]["method"]: json.loads(p.read_text())
             for p in (res / "cells").glob("*.json")}
    assert set(cells) == {"ar", "sd", "demo_sd"} and all(c["status"] == "ok" for c in cells.values())
    # the plug-in is sd under another name: the same seeds give the same tokens
    assert [g["tokens"] for g in cells["demo_sd"]["generations"]] == [g["tokens"] for g in cells["sd"]["generations"]]


def test_a_plugin_drafter_is_registered_and_runs_in_generate_and_a_sweep(plugin_site: Path, tmp_path: Path) -> None:
    code = ("import json; from mdv.drafters import DRAFTERS; from mdv.sweep.config import drafter_names;"
            " print(json.dumps([list(DRAFTERS), drafter_names('all')]))")
    proc = _run(plugin_site, ["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["eagle", "layerskip", "model", "ngram", "demo_lookup"]] * 2  # plug-ins last
    res = tmp_path / "res"
    proc = _run(plugin_site, [
        "-m", "experiments.run", "models=tiny_random", "method.names=[ar,sd]", "drafter.names=[ngram,demo_lookup]",
        "dataset=humaneval", "dataset.n_prompts=2", "sweep.K=[1]", "sweep.L=[3]", "sampling.temperatures=[0.7]",
        "sampling.max_new_tokens=8", "dataset.loader=tests.test_sweep:stub_prompts",
        "dataset.formatter=tests.test_sweep:stub_format", "threads=1", "progress=false", f"results_dir={res}"],
        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 cells: 3 run" in proc.stdout
    cells = {json.loads(p.read_text())["cell_id"].split("__")[1]: json.loads(p.read_text())
             for p in (res / "cells").glob("*.json")}
    assert set(cells) == {"ar", "sd+ngram", "sd+demo_lookup"} and all(c["status"] == "ok" for c in cells.values())
    # the plug-in is ngram (its default options) under another name: the same seeds give the same tokens
    assert ([g["tokens"] for g in cells["sd+demo_lookup"]["generations"]]
            == [g["tokens"] for g in cells["sd+ngram"]["generations"]])
    assert all(g["stats"]["drafter"] == "demo_lookup" for g in cells["sd+demo_lookup"]["generations"])


def test_a_plugin_verifier_runs_in_the_paired_measurement(plugin_site: Path, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from mdv.paired.measure import run_paired
        from mdv.paired.records import load_records
        from tests.test_paired import tiny_run_config

        cfg = tiny_run_config(Path({str(tmp_path)!r}))
        cfg.paired.methods = ["sd", "demo_sd"]
        rep = run_paired(cfg)
        recs = load_records(cfg.results_dir)
        print(json.dumps([len(rep.ok), [[c["etau"] for c in r["contexts"]] for r in recs]]))
        """)
    proc = _run(plugin_site, ["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, etaus = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ok == 2
    contexts = [c for rec in etaus for c in rec]
    assert contexts and all(c["demo_sd"] == c["sd"] for c in contexts)  # the same law on the same drafts
    assert any(v is not None and v > 0 for c in contexts for row in c["sd"] for v in row)


def test_a_plugin_verifier_is_audited_by_name(plugin_site: Path, tmp_path: Path) -> None:
    """``mdv audit sampler=demo_sd``: the plug-in's registry name reaches the audit with no edit to mdv."""
    proc = _run(plugin_site, ["-m", "experiments.audit", "sampler=demo_sd", "cases=smoke", "trials=4096",
                              "tv_resolution=0.2", "progress=false", f"hydra.run.dir={tmp_path / 'out'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "audit of demo_sd: LOSSLESS" in proc.stdout
    assert (tmp_path / "out" / "audit.md").is_file()

"""The README's shell entry points: arguments they refuse before any set-up runs."""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override", ["results_dir=/tmp/elsewhere", "++results_dir=/tmp/elsewhere"])
def test_main_job_refuses_a_results_dir_override(override: str) -> None:
    """``scripts/main.sh`` analyses ``$MDV_RESULTS``; a ``results_dir=`` override would send the sweep to one
    folder and the analysis to another, so it is refused with the variable to set, before the set-up."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "main.sh"), "dataset.n_prompts=2", override],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # the set-up did not run: it always prints its "[mdv setup] ready" line
    assert proc.stderr.strip() == (f"error: {override}: the analysis would read another directory; set the results"
                                   f" directory with MDV_RESULTS=/tmp/elsewhere bash scripts/main.sh")



def test_readme_oracle_example_prints_the_numbers_its_comments_state() -> None:
    """Run the README's oracle-API example; every expression whose comment starts with a number must
    evaluate to that number (to the 4 decimals shown)."""
    text = (ROOT / "README.md").read_text()
    code = text.split("## The oracle API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(code, namespace)
    checked = 0
    for line in code.splitlines():
        stmt, _, comment = line.partition("  # ")
        number = re.match(r"\s*(\d+\.\d+)", comment)
        if number and not re.match(r"\w+ = ", stmt):  # an expression line, not an assignment
            value = eval(stmt.strip(), namespace)
            assert round(value, 4) == float(number.group(1)), (stmt, value)
            checked += 1
    assert checked == 3  # E[tau] of gbv, the greedy LP optimum, the TV of the published SpecTr-GBV rule


def test_readme_audit_your_verifier_example_gives_the_report_it_shows() -> None:
    """Run the README's "Audit your verifier" example: the buggy rule is biased, and the summary's figures are
    the ones the comment shows (fixed seed)."""
    text = (ROOT / "README.md").read_text()
    code = text.split("## Audit your verifier", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    shown = re.search(r"e\.g\. (rand-\S+): TV ([\d.]+) \[([\d.]+), ([\d.]+)\], prefix (\[[\d, ]+\]) at ([\d.]+) vs ([\d.]+)",
                      code)
    assert shown, "the example's comment lost its figures"
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, namespace)
    report = namespace["report"]
    assert report.verdict == "biased" and report.lossless is False
    case, tv, lo, hi, prefix, observed, expected = shown.groups()
    assert f"e.g. {case}: TV {tv} [{lo}, {hi}], prefix {prefix} at {observed} vs {expected}" in report.summary()


"""The ``mdv`` command: one entry point for everything the repository's scripts do.

    mdv run [overrides]            a sweep, the paired measurement (task=paired) or the theory tables
                                   (experiment=theory); Hydra, configs in mdv/conf (python -m experiments.run)
    mdv theory [overrides]         the exact theory tables on toy pairs (python -m experiments.theory)
    mdv bench [overrides]          the benchmarks (python -m experiments.bench)
    mdv audit sampler=mod:fn       is a verification rule lossless, how far from optimal (python -m experiments.audit)
    mdv report RESULTS_DIR         tables, plots and verdicts of a results folder (python -m analysis.report)
    mdv bench-report FOLDER...     the bench report of benchmark records (python -m analysis.bench_report)
    mdv assets list|fetch|check    pinned, sha256-checked model and dataset files (python -m mdv.assets)
    mdv data list|fetch|check|show the datasets' offline sources (python -m mdv.data)

The Hydra configs ship inside the package (``mdv/conf``), so an installed ``mdv`` works from any folder.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence


def _hydra(module: str, name: str) -> Callable[[list[str]], int]:
    def run(args: list[str]) -> int:
        import importlib

        from mdv.cli.errors import hydra_cli

        main = importlib.import_module(module).main
        sys.argv = [f"mdv {name}", *args]  # Hydra parses sys.argv
        hydra_cli(main)
        return 0

    return run


def _argparse(module: str, name: str, prog_kw: bool = True) -> Callable[[list[str]], int]:
    def run(args: list[str]) -> int:
        import importlib

        main = importlib.import_module(module).main
        return int(main(args, prog=f"mdv {name}") if prog_kw else main(args) or 0)

    return run


#: command -> (what it does, the function that runs it on the remaining arguments -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "run": ("a sweep, the paired measurement or the theory tables (Hydra overrides)", _hydra("mdv.cli.run", "run")),
    "theory": ("the exact theory tables on toy pairs (Hydra overrides)", _hydra("mdv.cli.theory", "theory")),
    "bench": ("the benchmarks (Hydra overrides)", _hydra("mdv.cli.bench", "bench")),
    "audit": ("audit a verification rule: lossless? how far from optimal? (Hydra overrides)",
              _hydra("mdv.cli.audit", "audit")),
    "report": ("tables, plots and verdicts of a results folder", _argparse("mdv.cli.report", "report")),
    "bench-report": ("the bench report of benchmark records", _argparse("mdv.cli.bench_report", "bench-report")),
    "assets": ("pinned model and dataset files: list, fetch, check", _argparse("mdv.assets", "assets", False)),
    "data": ("the datasets' offline sources: list, fetch, check, show", _argparse("mdv.data.__main__", "data", False)),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mdv <command> [arguments]", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (what, _) in COMMANDS.items()]
    lines += ["", "mdv <command> --help shows a command's own options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``mdv <command> [arguments]``; an unknown command: the list of commands and exit status 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] not in COMMANDS:
        print(f"error: unknown mdv command {args[0]!r}; the commands are: {', '.join(COMMANDS)}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    return COMMANDS[args[0]][1](args[1:])


__all__ = ["COMMANDS", "main"]

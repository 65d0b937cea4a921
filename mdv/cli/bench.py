"""Benchmarks (Hydra entry point): ``python -m experiments.bench [overrides]``.

``benchmarks=[verifier]`` (or any of verifier, target_pass, e2e, oracle, memory, paired) selects what runs;
each prints a table with its goals and writes ``bench_<name>.json`` under the Hydra output folder
(``outputs/bench/<time>/``).  Sizes are set in ``mdv/conf/bench.yaml`` (schema :class:`mdv.bench.BenchConfig`),
e.g. ``verifier.vocab_sizes=[49152] verifier.K=[4] verifier.L=[8]``.
"""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from mdv.cli.errors import clean_errors
from mdv.bench import BenchConfig, run

ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


@hydra.main(version_base=None, config_path="../conf", config_name="bench")
@clean_errors
def main(cfg) -> None:
    config: BenchConfig = OmegaConf.to_object(cfg)  # typed: a wrong key, type or choice failed at compose time
    out = Path(HydraConfig.get().runtime.output_dir)
    records = run(config, out)
    print(f"\nbench: {', '.join(records)} -> {out}")


"""Audit a verification rule (Hydra entry point): ``python -m experiments.audit sampler=pkg.module:function``.

Writes audit.md, audit.csv, audit.json and audit.png under the Hydra output folder (``outputs/audit/<time>``)
and exits 0 (lossless), 1 (biased), 3 (inconclusive: the trial budget cannot promise the TV resolution)
or 2 (bad input: a sampler that cannot be imported, fails, or returns something that is not an outcome).
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from mdv.audit import VerifierSampler, audit, load_sampler, load_specs
from mdv.audit.config import EXIT_STATUS, AuditConfig
from mdv.audit.report import write
from mdv.cli.errors import clean_errors
from mdv.errors import InvalidInputError
from mdv.verify.base import Verifier
from mdv.verify.registry import get_verifier

ConfigStore.instance().store(name="audit_schema", node=AuditConfig)


@hydra.main(version_base=None, config_path="../conf", config_name="audit")
@clean_errors
def main(cfg) -> None:
    config: AuditConfig = OmegaConf.to_object(cfg)  # typed: a wrong key or type already failed at compose time
    rule = load_sampler(config.sampler)
    if config.options:
        if not isinstance(rule, Verifier):
            raise InvalidInputError(f"options= applies to a registered mdv verifier; sampler={config.sampler!r} is not one")
        options = ", ".join(f"{k}={v!r}" for k, v in config.options.items())
        rule = VerifierSampler(get_verifier(config.sampler, **config.options), name=f"{config.sampler}({options})")
    report = audit(rule, cases=[*load_specs(config.cases), *config.extra_cases], trials=config.trials,
                   alpha=config.alpha, seed=config.seed, looks=config.looks, batch=config.batch,
                   tv_resolution=config.tv_resolution, single_draft=config.single_draft, scalar=config.scalar,
                   with_references=config.references, stop_on_bias=config.stop_on_bias, progress=config.progress)
    paths = write(report, Path(HydraConfig.get().runtime.output_dir))
    print(report.summary())
    for name, path in paths.items():
        print(f"  {name}: {path}")
    sys.exit(EXIT_STATUS[report.verdict])

"""The audit command's typed Hydra schema (``audit_schema``, ``mdv/conf/audit.yaml``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from mdv.audit.cases import CaseSpec

#: Exit status of ``mdv audit`` per verdict (bad input: 2, as every mdv command).
EXIT_STATUS = {"lossless": 0, "biased": 1, "inconclusive": 3}


@dataclass
class AuditConfig:
    """``mdv audit sampler=package.module:function [overrides]``.

    sampler: the rule under audit: ``module:attribute`` (a batch sampler, a per-instance function with
    ``scalar=true``, a class built without arguments, or an mdv Verifier) or a registered verifier name;
    options: keyword options of a registered verifier (``+options.adjust_target=false``);
    cases: a shipped case grid (``mdv/conf/audit_cases/<name>.yaml``); extra_cases: more pairs (CaseSpec);
    the rest as :func:`mdv.audit.audit`.
    """

    sampler: str = MISSING
    options: dict[str, Any] = field(default_factory=dict)
    cases: str = "default"
    extra_cases: list[CaseSpec] = field(default_factory=list)
    trials: int = 2 ** 20
    alpha: float = 0.01
    seed: int = 0
    looks: int = 5
    batch: int = 2 ** 16
    tv_resolution: float = 0.01
    single_draft: Optional[bool] = None
    scalar: bool = False
    stop_on_bias: bool = False
    references: bool = True
    progress: bool = True

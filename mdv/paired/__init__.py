"""Paired exact-conditional measurement on real models (the issue "decisive verdicts on real models").

    config.py       PairedConfig: the typed Hydra group ``paired``
    conditional.py  the estimator: every verifier's exact E[tau | context, drafts] from its own ``law``
    measure.py      target trajectories, K_max drafts per context, one tree pass, resumable records
    stats.py        cluster bootstrap, paired differences, three-outcome verdicts
    cost.py         the calibrated cost model and user cost profiles: predicted speedups
    analysis.py     records -> estimates, claims, optimality gaps, predicted and measured speedups
    report.py       Markdown / CSV / plots
"""
from mdv.paired.conditional import (ConditionalAcceptance, all_conditional, conditional_acceptance,
                                    conditional_acceptance_reference, lump_undrafted, tree_nodes)
from mdv.paired.config import PairedConfig, validate_paired
from mdv.paired.measure import load_records, measure_prompt, run_paired
from mdv.paired.stats import Estimate, Verdict, cluster_bootstrap, paired_difference, verdict

__all__ = ["ConditionalAcceptance", "Estimate", "PairedConfig", "Verdict", "all_conditional", "cluster_bootstrap",
           "conditional_acceptance", "conditional_acceptance_reference", "load_records", "lump_undrafted",
           "measure_prompt", "paired_difference", "run_paired", "tree_nodes", "validate_paired", "verdict"]

"""Paired exact-conditional measurement on real models (the issue "decisive verdicts on real models").

    config.py       PairedConfig: the typed Hydra group ``paired``
    conditional.py  the estimator: every verifier's exact E[tau | context, drafts] from its own ``law``
    trajectory.py   the target-only trajectory, reusing the laws a context's tree pass holds
    measure.py      K_max drafts per context, one tree pass, every verifier's law; the resumable run
    records.py      one JSON record per (dataset, prompt): ids, reading back
    renewal.py      E[#iterations] of a capped run (the last iteration's cut)
    speedcheck.py   interleaved real generations that check the predicted speedups
    stats.py        cluster bootstrap, paired differences, three-outcome verdicts
    cost.py         the calibrated cost model and user cost profiles: predicted speedups
    analysis.py     records -> estimates, claims, optimality gaps, predicted and measured speedups
    report.py       Markdown / CSV / plots
"""
from mdv.paired.conditional import (ConditionalAcceptance, all_conditional, conditional_acceptance,
                                    conditional_acceptance_reference, lump_undrafted, tree_nodes)
from mdv.paired.config import PairedConfig, validate_paired
from mdv.paired.measure import measure_prompt, run_paired
from mdv.paired.records import load_records
from mdv.paired.stats import Estimate, Verdict, cluster_bootstrap, paired_difference, verdict

__all__ = ["ConditionalAcceptance", "Estimate", "PairedConfig", "Verdict", "all_conditional", "cluster_bootstrap",
           "conditional_acceptance", "conditional_acceptance_reference", "load_records", "lump_undrafted",
           "measure_prompt", "paired_difference", "run_paired", "tree_nodes", "validate_paired", "verdict"]

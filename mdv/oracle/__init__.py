"""The exact oracle: output laws by enumeration, exact LPs, expected accepted lengths.

    exact_law(method, target, draft, K, L, n_tokens, prompt=())     law of the first n_tokens generated
    iteration_law(method, target, draft, K, L, prompt=())          law of one iteration's emitted tokens
    expected_accepted(method, target, draft, K, L, prompt=())      exact E[tau] of one iteration
    lp_optimum(target, draft, K, L, kind, prompt=())               kind "valid" | "greedy"
    membership_ot_sorted(p, q, K)                                  α*_K in O(V log V) (sorted-prefix min-cut)
"""
from mdv.oracle.enumerate import (enumerate_block, exact_law, expected_accepted, iteration_law, target_law,
                                  total_variation)
from mdv.oracle.lp import (LPSolveError, gbv_expected_accepted_formula, lp_greedy, lp_optimum, lp_valid,
                           membership_ot, membership_ot_mincut, membership_ot_upper_bound,
                           paper_claimed_expected_accepted, sd_expected_accepted_formula)
from mdv.oracle.membership import membership_ot_sorted, membership_ot_sorted_batch, membership_ot_sorted_upto
from mdv.oracle.toy import iid_toy_model, random_toy_model

__all__ = ["enumerate_block", "exact_law", "expected_accepted", "iteration_law", "target_law", "total_variation",
           "iid_toy_model", "random_toy_model", "LPSolveError", "gbv_expected_accepted_formula", "lp_greedy",
           "lp_optimum", "lp_valid", "membership_ot", "membership_ot_mincut", "membership_ot_sorted",
           "membership_ot_sorted_batch", "membership_ot_sorted_upto", "membership_ot_upper_bound",
           "paper_claimed_expected_accepted", "sd_expected_accepted_formula"]

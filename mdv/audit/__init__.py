"""Audit any verification rule: is it lossless, and how far from optimal is it?

    audit(rule, cases="default", trials=2**20, alpha=0.01, seed=0) -> AuditReport

``rule`` follows the sampler protocol of :mod:`mdv.audit.protocol` (a batch function of tokens, q, p and
a generator returning tau, sel, token), or is an mdv verifier; :mod:`mdv.audit.audit` states the design
(sequential chi-square tests against the exact target law, Holm across cases, detectable TV, accepted
length against the exact LP optima), :mod:`mdv.audit.report` writes the Markdown, CSV and plot.
"""
from mdv.audit.audit import AuditReport, CaseResult, audit
from mdv.audit.cases import AuditCase, CaseSpec, load_specs
from mdv.audit.protocol import SamplerError, ScalarSampler, VerifierSampler, as_sampler, load_sampler

__all__ = ["AuditCase", "AuditReport", "CaseResult", "CaseSpec", "SamplerError", "ScalarSampler",
           "VerifierSampler", "as_sampler", "audit", "load_sampler", "load_specs"]

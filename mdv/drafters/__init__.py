"""Drafters: what proposes the K i.i.d. draft blocks of an iteration, each with its exact law q.

One rule per module, registered by name (:data:`DRAFTERS`): ``model`` (a separate draft model),
``ngram`` (prompt lookup with an empirical law), ``layerskip`` (the target's first layers), ``eagle`` (one
layer over the target's own features); plug-ins
through the entry-point group ``mdv.drafters``.  :mod:`mdv.drafters.base` states the protocol.
"""
from mdv.drafters.base import Draft, Drafter
from mdv.drafters.registry import DRAFTERS, get_drafter, register_drafter

__all__ = ["DRAFTERS", "Draft", "Drafter", "get_drafter", "register_drafter"]

"""Verifiers behind one interface (see :mod:`mdv.verify.base`) and their registry."""
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.registry import VERIFIERS, get_verifier

__all__ = ["Block", "Branch", "Outcome", "Uniforms", "Verifier", "VERIFIERS", "get_verifier"]

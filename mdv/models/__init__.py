"""Language models behind one protocol, and the sampling transforms shared by target and draft."""
from mdv.models.base import LanguageModel
from mdv.models.callable import CallableLM
from mdv.models.sampling import SamplingConfig, apply_sampling

__all__ = ["LanguageModel", "CallableLM", "SamplingConfig", "apply_sampling"]

"""Language models behind one protocol, and the sampling transforms shared by target and draft."""
from mdv.models.base import LanguageModel
from mdv.models.callable import CallableLM
from mdv.models.hf import HFModel
from mdv.models.lean import LeanModel
from mdv.models.packed import LinearPacks
from mdv.models.panels import PanelPacks
from mdv.models.sampling import SamplingConfig, apply_sampling
from mdv.models.session import DecodeSession, PrefixSession, open_session

__all__ = ["LanguageModel", "CallableLM", "HFModel", "LeanModel", "LinearPacks", "PanelPacks", "SamplingConfig", "apply_sampling", "DecodeSession",
           "PrefixSession", "open_session"]

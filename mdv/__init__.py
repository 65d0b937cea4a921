"""mdv: speculative decoding verification -- verifiers behind one interface, an exact oracle, real
models and experiments.  See README.md for the audit API."""
__version__ = "0.1.0"

from mdv import engine, metrics, models, oracle, progress, verify  # noqa: E402  (progress: tqdm's lock per forked process)
from mdv.engine import GenerationResult, StepRecord, generate  # noqa: E402
from mdv.verify.registry import VERIFIERS, get_verifier  # noqa: E402

__all__ = ["VERIFIERS", "get_verifier", "generate", "GenerationResult", "StepRecord", "engine", "metrics", "models",
           "oracle", "verify", "__version__"]

"""Thin entry points over :mod:`mdv.analysis`: ``python -m analysis.report <results_dir> [--out DIR]``."""

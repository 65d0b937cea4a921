"""Token trees: K draft blocks that share a prefix, scored by the target in ONE row.

The K i.i.d. drafts of an iteration all continue the same committed sequence, and often agree on
their first tokens.  Scoring them as K full rows repeats the shared part (and copies the cached
prefix K times); a token tree keeps every distinct prefix once and lets each node attend only to the
cached prefix, its ancestors and itself (a "tree attention" mask, as in SpecInfer, Miao et al. 2024,
and Medusa, Cai et al. 2024).  The target's scores after node j are then exactly its scores after
the path root -> j, i.e. what row k of the K-row pass gives at the same position.

Layout: nodes ``0 .. m-1`` are the pending tokens (committed tokens not yet in the target's cache, a
chain), then every distinct draft prefix in order of first appearance.  Parents precede children.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from mdv.errors import InvalidInputError


@dataclass(frozen=True)
class TokenTree:
    """A token tree over a chain of pending tokens and K draft blocks.

    ids, parent, depth: per node (``parent`` -1 for the root, ``depth`` 0 for the root).
    node_of: [K, L+1] -- ``node_of[k, i]`` is the node reached after the pending chain and the first i
    tokens of draft k (``node_of[k, 0]`` is the last pending token): the target's scores there are the
    law before draft token i + 1 (i = L: the bonus position).
    """

    ids: list[int]
    parent: list[int]
    depth: list[int]
    node_of: Tensor  # [K, L+1] long

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def chain(self) -> int:
        """Number of pending tokens (the chain before the first draft token)."""
        return int(self.node_of[0, 0]) + 1

    def path(self, k: int, accepted: int) -> list[int]:
        """The nodes of the pending chain and the first ``accepted`` tokens of draft k, root first."""
        return list(range(self.chain)) + self.node_of[k, 1:accepted + 1].tolist()

    def ancestors(self) -> np.ndarray:
        """[n, n] bool: ``a[j, i]`` is True when node i is node j or one of its ancestors."""
        n = self.size
        anc = np.zeros((n, n), dtype=bool)
        for j, par in enumerate(self.parent):  # parents precede children: their rows are complete
            if par >= 0:
                anc[j] = anc[par]
            anc[j, j] = True
        return anc

    def attention_mask(self, past: int, device: torch.device | str = "cpu") -> Tensor:
        """Boolean mask [1, 1, n, past + n] (True = attend): every node sees the ``past`` cached tokens,
        its ancestors and itself."""
        n = self.size
        mask = np.ones((n, past + n), dtype=bool)
        mask[:, past:] = self.ancestors()
        return torch.from_numpy(mask)[None, None].to(device)

    def check_path(self, nodes: Sequence[int]) -> list[int]:
        """``nodes`` as a list when they form a path from the root (each the parent of the next), else
        :class:`~mdv.errors.InvalidInputError`."""
        nodes = [int(j) for j in nodes]
        ok = bool(nodes) and nodes[0] == 0 and all(0 <= j < self.size for j in nodes)
        ok = ok and all(self.parent[b] == a for a, b in zip(nodes, nodes[1:]))
        if not ok:
            raise InvalidInputError(f"keep_nodes() needs a path from the tree's root (node 0); got {nodes}")
        return nodes


def build_tree(pending: Sequence[int], drafts: Tensor) -> TokenTree:
    """The token tree of K draft blocks that continue the chain of ``pending`` tokens.

    pending: the m >= 1 committed tokens not yet processed by the target (usually one: the last
    correction or bonus token).  drafts: [K, L] token ids.  Equal draft prefixes share their nodes.
    """
    m = len(pending)
    if m < 1:
        raise InvalidInputError("a token tree needs at least one pending token (its root)")
    if drafts.dim() != 2 or drafts.shape[1] < 1:
        raise InvalidInputError(f"drafts must have shape [K, L >= 1]; got {tuple(drafts.shape)}")
    K, L = drafts.shape
    ids = [int(t) for t in pending]
    parent = list(range(-1, m - 1))
    depth = list(range(m))
    node_of = torch.empty(K, L + 1, dtype=torch.long)
    node_of[:, 0] = m - 1
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for k, row in enumerate(drafts.tolist()):
        node = m - 1
        for i, tok in enumerate(row, start=1):
            key = (node, int(tok))
            child = children.get(key)
            if child is None:
                child = children[key] = len(ids)
                ids.append(int(tok))
                parent.append(node)
                depth.append(m - 1 + i)
            node = child
            node_of[k, i] = node
    return TokenTree(ids, parent, depth, node_of)


__all__ = ["TokenTree", "build_tree"]

"""Parameter groups: the argument leaves a search decides together (issue 12).

Models repeat layers, and optimizers mirror parameters. A search that tiles leaves one at a
time must rediscover the same choice for every layer and every moment, which multiplies the
depth it needs (paper 1 app. A.5.3 searches per-leaf). Here a group is every leaf whose key path
is the same once layer indices are removed (`Block_3` -> `Block`, `layers/0` -> `layers`) and
that has the same shape; optimizer-state leaves join the parameter group whose path is a suffix
of theirs (`opt_state/0/mu/Block_1/attn/query/kernel` joins `params/Block_*/attn/query/kernel`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from partir_plugin.extend import Leaf

_INDEX = re.compile(r"_\d+$")


@dataclass(frozen=True)
class Group:
    """Leaves decided as one: `name` reads like the role ("params/Block_*/attn/query/kernel")."""

    name: str
    leaves: tuple[int, ...]  # indices into the context's leaves
    shape: tuple[int, ...]
    nbytes: int  # all leaves together


def role(path: str) -> tuple[str, ...]:
    """The key path's parts without layer indices: a part that is a number is dropped, a
    trailing `_<number>` is cut."""
    return tuple(_INDEX.sub("", p) for p in path.split("/") if p and not p.isdigit())


def _display(members: list[Leaf]) -> str:
    """The first member's name, with a `*` where the members of its argument differ
    ("params/Block_*/attn/query/kernel"); a group of one layer keeps its path."""
    same = [m.qualified.split("/") for m in members if m.arg == members[0].arg]
    parts = same[0]
    return "/".join(p if all(len(o) == len(parts) and o[j] == p for o in same) else
                    (_INDEX.sub("_*", p) if _INDEX.search(p) else "*")
                    for j, p in enumerate(parts))


def find_groups(leaves: list[Leaf], candidates: list[int]) -> list[Group]:
    """Group `candidates` (leaf indices) by role and shape, moments joining their parameter.

    A role owned by several arguments stays split by argument, except that an argument whose
    role path ends with another argument's role path (an optimizer moment ends with its
    parameter's path) joins that one. Groups come in the leaves' order (deterministic)."""
    keys = {i: (leaves[i].arg, role(leaves[i].path), leaves[i].shape) for i in candidates}
    owners: dict[tuple, tuple] = {}  # (role, shape) -> the first key with exactly that role
    for key in keys.values():
        owners.setdefault(key[1:], key)
    members: dict[tuple, list[int]] = {}
    for i in candidates:
        arg, parts, shape = key = keys[i]
        for k in range(1, len(parts)):  # the longest proper suffix another argument owns
            owner = owners.get((parts[k:], shape))
            if owner is not None and owner[0] != arg:
                key = owner
                break
        members.setdefault(key, []).append(i)
    return [Group(_display([leaves[i] for i in idx]), tuple(idx), key[2],
                  sum(leaves[i].value.type.nbytes for i in idx))
            for key, idx in members.items()]

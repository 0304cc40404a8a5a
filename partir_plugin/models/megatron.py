"""Parameter-name sharding rules for the benchmark models (paper appendix A.6, Flax names).

A rule is a callable ``(path: str, shape: tuple[int, ...]) -> int | None``: given a leaf's path
(keys joined by ``"/"``, see :func:`partir_plugin.models.common.param_paths`) and shape, it returns
the dimension to tile along the mesh axis the tactic names, or ``None`` for "not decided here,
let propagation decide" (the paper's ``UNKNOWN``). Rules index dimensions from the *end* of the
shape, so the same rule serves unrolled parameters and ``nn.scan``-stacked ones (which have an
extra leading ``[L]`` dimension).

Megatron (Shoeybi et al. 2019) splits each attention layer by heads and each MLP by its hidden
units: q/k/v and ``dense_up`` are column-parallel, ``out`` and ``dense_down`` row-parallel, so a
block needs one all-reduce after attention and one after the MLP in the forward pass, and two
in the backward pass (4 per layer, paper §7.3).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from partir_plugin.models.common import param_paths

Rule = Callable[[str, tuple[int, ...]], int | None]

_QKV = re.compile(r"(^|/)attn/(query|key|value)/kernel$")
_OUT = re.compile(r"(^|/)attn/out/kernel$")
_UNET_CONV = re.compile(r"(^|/)(down_\d+|mid|up_\d+)_res_\d+/conv_(0|1)/kernel$")
_MLP_HIDDEN = re.compile(r"(^|/)hidden_(\d+)/kernel$")
_EXPERTS = re.compile(r"(^|/)moe/(up|down)/kernel$")


def _attention(path: str, shape: tuple[int, ...]) -> int | None:
    """Heads dim of ``query|key|value`` (``[..., D, H, Dh]``) and ``out`` (``[..., H, Dh, D]``).

    A 2-D key/value kernel (``[D, Dh]``, IT's multi-query attention) has one shared head and
    cannot be split by heads: ``None`` (replicated under Megatron, as in Pope et al. 2022).
    """
    if _QKV.search(path):
        return len(shape) - 2 if len(shape) >= 3 else None
    if _OUT.search(path):
        return len(shape) - 3
    return None


def transformer_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """Megatron MP for T (unrolled or scanned) and IT.

    ``attn/{query,key,value}/kernel [D, H, Dh]`` -> 1 (heads); ``attn/out/kernel [H, Dh, D]`` ->
    0 (heads); ``mlp/dense_up/kernel [D, F]`` -> 1 (output); ``mlp/dense_down/kernel [F, D]`` ->
    0 (input); all with +1 under ``nn.scan``. IT's ``[D, Dh]`` key/value kernels, embeddings,
    norm scales and the unembedding -> ``None``.
    """
    if path.endswith("dense_up/kernel"):
        return len(shape) - 1
    if path.endswith("dense_down/kernel"):
        return len(shape) - 2
    return _attention(path, shape)


def unet_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """Megatron-style MP for the UNet.

    In every residual block (``*_res_*``) ``conv_0/kernel [3, 3, C_in, 4C]`` -> 3 (output
    channels) and ``conv_1/kernel [3, 3, 4C, C]`` -> 2 (input channels), so the 4x-wide hidden
    activation is channel-sharded between them; the middle attention's q/k/v/out kernels are
    split by heads as in :func:`transformer_rule`. Biases, norms, skip/up/down-sampling convs,
    ``conv_in``/``conv_out`` and the time MLPs -> ``None``.
    """
    match = _UNET_CONV.search(path)
    if match:
        return len(shape) - 1 if match.group(3) == "0" else len(shape) - 2
    return _attention(path, shape)


def mlp_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """Megatron for `models/mlp.py`: `hidden_{2k}` kernels split their outputs, `hidden_{2k+1}`
    their inputs, so each pair needs one all_reduce forward and one backward; the logits layer
    is left to propagation."""
    m = _MLP_HIDDEN.search(path)
    if m is None:
        return None
    return len(shape) - 1 if int(m.group(2)) % 2 == 0 else len(shape) - 2


def expert_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """EP for `models/moe.py`: the expert dim of ``moe/up/kernel [E, D, F]`` and
    ``moe/down/kernel [E, F, D]`` (0; 1 under ``nn.scan``), so each device holds its experts
    whole; router, attention, norms and embeddings -> ``None``."""
    return len(shape) - 3 if _EXPERTS.search(path) else None


def moe_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """Megatron MP for `models/moe.py`: attention by heads as in :func:`transformer_rule`, and
    inside every expert its hidden units F, column-parallel in ``moe/up/kernel [E, D, F]`` (2)
    and row-parallel in ``moe/down/kernel [E, F, D]`` (1), +1 under ``nn.scan``. It leaves the
    expert dim to EP (:func:`expert_rule`), so the two compose on two axes."""
    match = _EXPERTS.search(path)
    if match:
        return len(shape) - 1 if match.group(2) == "up" else len(shape) - 2
    return _attention(path, shape)


def multi_query_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """MQ for IT's *cache* argument (Pope et al. 2022): tile every ``Block_{i}/key|value``
    cache tensor ``[B, T, Dh]`` on its batch dim 0 along the model axis, since multi-query
    attention's single key/value head cannot be split by heads. Anything else -> ``None``."""
    del shape
    return 0 if re.search(r"(^|/)(key|value)$", path) else None


def edge_sharding_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """ES for the GNS *batch* argument: tile ``edges``, ``senders`` and ``receivers`` on dim 0
    (edges); node arrays -> ``None`` (replicated by propagation)."""
    del shape
    return 0 if path in ("edges", "senders", "receivers") else None


def sharded_dims(rule: Rule, tree: Mapping[str, Any]) -> dict[str, int]:
    """The paths of ``tree`` for which ``rule`` decides a dimension, with that dimension."""
    out = {}
    for path, shape in param_paths(tree).items():
        dim = rule(path, shape)
        if dim is not None:
            out[path] = dim
    return out

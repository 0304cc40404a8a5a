"""Pipeline parallelism (the PP tactic) on the scanned-LM recipes users write (issue "Pipeline
parallelism breaks on the standard scanned-LM recipe").

Every test partitions a step with `partir.jit(fn, mesh, schedule)` and compares its loss and
every gradient leaf (and any other output) with the unpartitioned `jax.jit(fn)` of the same
function on the same inputs and rng, to float32 rounding. Models are tiny (d_model 16, seq 8,
4 layers) so each test takes seconds on 8 virtual CPU devices.

Batch sizes: `[PP(M=4), BP]` on `{stage: 2, batch: 4}` needs the batch divisible by
M x 4 = 16 (docs/tactics.md, PP errors), so those tests use B = 16; PP alone uses B = 8.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from oracle import assert_close, assert_matches_jax_jit

import partir_plugin as partir

pytestmark = pytest.mark.slow  # compiles a pipelined LM step per recipe

MESH = {"stage": 2, "batch": 4}
LAYERS, D, T, F, VOCAB = 4, 16, 8, 32, 32
THIS_FILE = Path(__file__).name


def PP(microbatches: int = 4):
    return partir.tactic("PP", axis="stage", microbatches=microbatches)


def BP():
    return partir.tactic("BP", axis="batch")


def partitioned_matches_jit(fn, args, schedule, mesh=MESH, what: str = ""):
    """partir.jit(fn) on `args` gives jax.jit(fn)'s numbers; returns (step, meta, got, want)."""
    matched = assert_matches_jax_jit(fn, args, mesh, schedule, what=what)
    return matched.step, matched.meta, matched.got, matched.want


def _line_of(fn, needle: str) -> int:
    """The source line number in this file of the first line of `fn` containing `needle`."""
    lines, start = inspect.getsourcelines(fn)
    for k, text in enumerate(lines):
        if needle in text:
            return start + k
    raise AssertionError(f"{needle!r} not in {fn.__name__}")


# -- shared plain-JAX pieces -----------------------------------------------------------------

def _init_stack(seed=0, layers=LAYERS, d=D, names=("wq", "wk", "wv", "wo")):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(names))
    return {n: jax.random.normal(k, (layers, d, d)) / np.sqrt(d) for n, k in zip(names, keys)}


@functools.partial(jax.jit, static_argnums=0)
def jitted_causal_mask(t: int) -> jax.Array:
    """A user's jitted helper: the causal mask `tril(ones(T, T))`."""
    return jnp.tril(jnp.ones((t, t), jnp.bool_))


def _attention(x, p, mask):
    """x [B, T, D], mask broadcastable to [B, T, T] (True = attend)."""
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(x.shape[-1])
    s = jnp.where(mask, s, -1e9)
    return x + jnp.einsum("bts,bsd->btd", jax.nn.softmax(s, axis=-1), v) @ p["wo"]


def _tokens_batch(seed=1, b=16, t=T, d=D):
    k = jax.random.split(jax.random.PRNGKey(seed), 2)
    return {"x": jax.random.normal(k[0], (b, t, d)),
            "y": jax.random.normal(k[1], (b, t, d))}


def _padding_mask(b=16, t=T):
    """Row i has its last (i % 4) positions padded (False)."""
    lengths = t - (np.arange(b) % 4)
    return jnp.asarray(np.arange(t)[None, :] < lengths[:, None])


# == 1. randomness inside the layer body ======================================================

def _dropout_scan_step(params, keys, batch):
    """A plain lax.scan over 4 stacked layers whose body draws a Bernoulli mask of the
    activations' shape from its own layer key (keys stacked per layer as an xs)."""

    def body(h, layer):
        w, key = layer
        keep = jax.random.bernoulli(key, 0.5, h.shape)
        return jnp.tanh(h @ w) * keep / 0.5, None

    def loss(params):
        out, _ = lax.scan(body, batch, (params, keys))
        return jnp.mean(out ** 2), out

    (value, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, grads, out


def test_layer_dropout_keys_as_xs_draw_per_example_masks():
    """8 identical input rows: jax.jit's dropout masks differ per row (the mask has the whole
    batch's shape), so its 8 output rows differ. Microbatching must not make a microbatch-
    shaped mask that repeats over the microbatches."""
    params = jax.random.normal(jax.random.PRNGKey(0), (LAYERS, D, D)) / 4
    keys = jax.random.split(jax.random.PRNGKey(42), LAYERS)
    batch = jnp.broadcast_to(jax.random.normal(jax.random.PRNGKey(1), (1, D)), (8, D))
    want = jax.jit(_dropout_scan_step)(params, keys, batch)
    assert len({tuple(np.asarray(r).round(5)) for r in want[2]}) == 8, "jax.jit's rows"
    step, _ = partir.jit(_dropout_scan_step, MESH, [PP(4)])
    got = step(params, keys, batch)
    rows = {tuple(np.asarray(r).round(5)) for r in got[2]}
    assert len(rows) == 8, (f"PP(M=4) gives {len(rows)} distinct output rows of 8 (jax.jit: "
                            f"8): the dropout mask is drawn per microbatch, not per example")
    assert_close(got, want, what="dropout with per-layer keys as scan xs under [PP(4)]")


class DropoutBlock(nn.Module):
    rate: float = 0.1

    @nn.compact
    def __call__(self, x, _):
        h = nn.Dense(F, name="up")(x)
        h = nn.Dropout(self.rate, deterministic=False)(nn.gelu(h))
        return x + nn.Dense(x.shape[-1], name="down")(h), None


class DropoutStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(D, name="embed")(x)
        scanned = nn.scan(nn.remat(DropoutBlock), variable_axes={"params": 0},
                          split_rngs={"params": True, "dropout": True},
                          in_axes=nn.broadcast, length=LAYERS)
        x, _ = scanned(name="blocks")(x, None)
        return nn.Dense(D, name="head")(x)


def _linen_dropout_setup(b=16):
    batch = _tokens_batch(b=b)
    variables = DropoutStack().init({"params": jax.random.PRNGKey(0),
                                     "dropout": jax.random.PRNGKey(1)}, batch["x"])

    def step(params, batch, rng):
        def loss(params):
            out = DropoutStack().apply({"params": params}, batch["x"], rngs={"dropout": rng})
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    return step, (variables["params"], batch, jax.random.PRNGKey(7))


def test_linen_dropout_in_scanned_remat_block_under_pp_bp():
    step, args = _linen_dropout_setup()
    _, meta, got, _ = partitioned_matches_jit(step, args, [PP(4), BP()],
                                              what="nn.scan(nn.remat(Block)) with Dropout(0.1)")
    spec = meta.in_shardings[0]["blocks"]["up"]["kernel"].spec
    assert spec and spec[0] == "stage", f"stacked kernel not on its stages: {spec}"


def test_linen_dropout_under_pp_bp_with_rm_recomputing_each_layer():
    """RM's per-layer recomputation under PP (`unit="layer"`) on top of the model's own
    `nn.remat`, with dropout: each recomputed layer draws its microbatch's rows of the
    unpipelined masks again."""
    step, args = _linen_dropout_setup()
    partitioned_matches_jit(step, args, [PP(4), BP(),
                                         partir.tactic("RM", policy="full", unit="layer")],
                            what="nn.scan(nn.remat(Block)) with Dropout(0.1), RM each layer")


def test_threefry_partitionable_is_the_default_and_dropout_matches():
    """The library matches jax.jit under jax's default RNG (threefry partitionable: each
    element's bits depend on its index, not on the shape a device draws). Checked without PP
    (BP alone: rng partitioning itself is right) and with PP, under the default."""
    assert jax.config.jax_threefry_partitionable is True, (
        "jax_threefry_partitionable is no longer True by default: revisit these tests")
    step, args = _linen_dropout_setup()
    partitioned_matches_jit(step, args, [BP()], what="Dropout(0.1) under [BP] (no PP)")
    partitioned_matches_jit(step, args, [PP(4), BP()],
                            what="Dropout(0.1) under [PP(4), BP], threefry partitionable")


def test_plain_scan_dropout_under_pp_bp_with_typed_keys():
    """The same per-layer-key dropout, new-style typed keys (`jax.random.key`), a [B, T, D]
    activation, under [PP(4), BP]: loss, grads and outputs."""
    params = jax.random.normal(jax.random.PRNGKey(0), (LAYERS, D, D)) / 4
    keys = jax.random.split(jax.random.key(3), LAYERS)

    def step(params, keys, batch):
        def body(h, layer):
            w, key = layer
            keep = jax.random.bernoulli(key, 0.9, h.shape)
            return jnp.where(keep, jnp.tanh(h @ w) / 0.9, 0.0), None

        def loss(params):
            out, _ = lax.scan(body, batch["x"], (params, keys))
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    partitioned_matches_jit(step, (params, keys, _tokens_batch()), [PP(4), BP()])


# == 2. jax.checkpoint / nn.remat / nested jax.jit inside the layer body ======================

def _scan_with_body(kind: str):
    def layer(h, p):
        if kind == "nested_jit":
            mask = jitted_causal_mask(h.shape[1])
        else:
            mask = jnp.tril(jnp.ones((h.shape[1], h.shape[1]), jnp.bool_))
        return _attention(h, p, mask), None

    if kind == "checkpoint":
        body = jax.checkpoint(layer)
    elif kind == "checkpoint_policy":
        policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        body = jax.checkpoint(layer, policy=policy)
    elif kind == "nested_jit":
        body = layer
    elif kind == "jit_body":
        body = jax.jit(layer)
    else:
        raise ValueError(kind)

    def step(params, batch):
        def loss(params):
            out, _ = lax.scan(body, batch["x"], params)
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    step.__name__ = f"step_{kind}"
    return step


@pytest.mark.parametrize("kind", [
    "checkpoint", pytest.param("checkpoint_policy", marks=pytest.mark.exhaustive), "nested_jit",
    "jit_body"])
def test_checkpointed_or_jitted_layer_body(kind):
    """jax.checkpoint (with and without a policy), a jitted helper building the causal mask,
    and a jitted body: each once crashed PP with an IndexError."""
    partitioned_matches_jit(_scan_with_body(kind), (_init_stack(), _tokens_batch()),
                            [PP(4), BP()], what=f"layer body with {kind} under [PP(4), BP]")


class MaskedBlock(nn.Module):
    """A causal self-attention + MLP block reading a broadcast padding mask [B, T]."""

    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, pad):
        causal = jitted_causal_mask(x.shape[1])
        mask = causal[None, None] & pad[:, None, None, :]  # [B, 1, T, T]
        h = nn.LayerNorm(name="ln1")(x)
        h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=D, name="attn",
                                            dropout_rate=self.dropout, deterministic=False)(
            h, h, mask=mask)
        x = x + nn.Dropout(self.dropout, deterministic=False)(h)
        h = nn.Dense(F, name="up")(nn.LayerNorm(name="ln2")(x))
        h = nn.Dense(D, name="down")(nn.gelu(h))
        return x + nn.Dropout(self.dropout, deterministic=False)(h), None


class Decoder(nn.Module):
    """The standard recipe: embed, nn.scan(nn.remat(Block)) with split param and dropout
    rngs and the padding mask broadcast to every layer, final norm, head."""

    dropout: float = 0.1
    remat: bool = True

    @nn.compact
    def __call__(self, tokens, pad):
        x = nn.Embed(VOCAB, D, name="embed")(tokens)
        block = nn.remat(MaskedBlock) if self.remat else MaskedBlock
        blocks = nn.scan(block, variable_axes={"params": 0},
                         split_rngs={"params": True, "dropout": True},
                         in_axes=nn.broadcast, length=LAYERS)(self.dropout, name="blocks")
        x, _ = blocks(x, pad)
        return nn.Dense(VOCAB, name="head")(nn.LayerNorm(name="ln_f")(x))


def _lm_batch(b=16, seed=2):
    k = jax.random.split(jax.random.PRNGKey(seed), 2)
    tokens = jax.random.randint(k[0], (b, T), 0, VOCAB)
    return {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1), "pad": _padding_mask(b)}


def _lm_loss(model, params, batch, rng):
    logits = model.apply({"params": params}, batch["tokens"], batch["pad"],
                         rngs={"dropout": rng})
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    w = batch["pad"].astype(jnp.float32)
    return jnp.sum(xent * w) / jnp.sum(w)


def _lm_params(model, batch):
    return model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)},
                      batch["tokens"], batch["pad"])["params"]


# Exhaustive: the acceptance test below runs the same remat'd block and jitted mask helper
# with dropout (this one tells the two apart when it fails).
@pytest.mark.exhaustive
@pytest.mark.parametrize("remat", [True, False])
def test_linen_remat_block_with_jitted_mask_helper_no_dropout(remat):
    """nn.remat(Block) (and, as a control, the block without remat) in nn.scan, its causal
    mask built by a jitted helper; no dropout, so only remat and the nested jit are tested."""
    model = Decoder(dropout=0.0, remat=remat)
    batch = _lm_batch()

    def step(params, batch):
        return jax.value_and_grad(lambda p: _lm_loss(model, p, batch, jax.random.PRNGKey(0)))(
            params)

    partitioned_matches_jit(step, (_lm_params(model, batch), batch), [PP(4), BP()],
                            what=f"linen decoder, remat={remat}, no dropout")


# == 3. per-example tensors read by every layer, not carried ==================================

def test_plain_scan_closing_over_padding_mask_positions_and_segments():
    """The layer body closes over per-example [B, T] tensors (padding mask, positions,
    segment ids) that are neither carried nor scanned: under PP each microbatch must read its
    own rows of them."""
    params = _init_stack()
    b = 16
    batch = {**_tokens_batch(b=b), "pad": _padding_mask(b),
             "positions": jnp.asarray(np.arange(T)[None, :] + 3 * np.arange(b)[:, None]),
             "segments": jnp.asarray((np.arange(T)[None, :] >= (np.arange(b) % T)[:, None])
                                     .astype(np.int32))}

    def step(params, batch):
        pad, seg = batch["pad"], batch["segments"]
        mask = (jnp.tril(jnp.ones((T, T), jnp.bool_))[None]
                & (seg[:, :, None] == seg[:, None, :]) & pad[:, None, :])
        phase = jnp.sin(batch["positions"].astype(jnp.float32) / 4.0)[..., None]

        def body(h, p):
            return _attention(h + phase, p, mask) * pad[..., None], None

        def loss(params):
            out, _ = lax.scan(body, batch["x"], params)
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    partitioned_matches_jit(step, (params, batch), [PP(4), BP()],
                            what="scan body closing over pad/positions/segments [B, T]")


def test_plain_scan_closing_over_padding_mask_pp_only():
    """The same closure over a [B, T] mask, PP alone (no BP): a microbatch must not read the
    whole batch's mask nor the first microbatch's."""
    params = _init_stack()
    batch = {**_tokens_batch(b=8), "pad": _padding_mask(8)}

    def step(params, batch):
        pad = batch["pad"]

        def body(h, p):
            return _attention(h, p, pad[:, None, :]), None

        def loss(params):
            out, _ = lax.scan(body, batch["x"], params)
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    partitioned_matches_jit(step, (params, batch), [PP(4)],
                            what="scan body closing over a padding mask, [PP(4)] only")


@pytest.mark.exhaustive  # the acceptance test below passes the same mask with dropout and remat
def test_linen_scan_broadcast_padding_mask():
    """nn.scan(..., in_axes=nn.broadcast) passes the [B, T] padding mask to every layer (no
    dropout, no remat: only the broadcast per-example input is tested)."""
    model = Decoder(dropout=0.0, remat=False)
    batch = _lm_batch()

    def step(params, batch):
        return jax.value_and_grad(lambda p: _lm_loss(model, p, batch, jax.random.PRNGKey(0)))(
            params)

    partitioned_matches_jit(step, (_lm_params(model, batch), batch), [PP(4), BP()],
                            what="nn.scan with the padding mask as nn.broadcast")


# == 4. carries that sum a scalar per layer; reverse scans ===================================

def _aux_step(params, batch):
    """carry = (x, aux): each layer adds the mean square of its hidden activations, as an MoE
    load-balancing loss or an activation regulariser does."""

    def body(carry, p):
        x, aux = carry
        h = jnp.tanh(x @ p["wq"])
        aux = aux + jnp.mean(h ** 2)
        return (x + h @ p["wo"], aux), None

    def loss(params):
        (out, aux), _ = lax.scan(body, (batch["x"], jnp.zeros((), jnp.float32)), params)
        return jnp.mean((out - batch["y"]) ** 2) + 0.1 * aux, aux

    (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, aux, grads


def test_scalar_auxiliary_loss_in_the_carry():
    """The aux summed in the carry must come out as the unpipelined program computes it (the
    mean over the whole batch, summed over layers), with its gradients."""
    partitioned_matches_jit(_aux_step, (_init_stack(), _tokens_batch()), [PP(4), BP()],
                            what="carry (x, aux) with aux += mean(h**2) per layer")


def test_scalar_auxiliary_loss_in_the_carry_pp_only():
    partitioned_matches_jit(_aux_step, (_init_stack(), _tokens_batch(b=8)), [PP(4)],
                            what="carry (x, aux), [PP(4)] only")


def _routed_aux_step(choose: str):
    """An MoE-style auxiliary loss: each token's probability of the expert it is routed to
    (chosen by top_k or argsort, as dropless routers choose), averaged, added to a carry
    that starts as a Python float (helper-25: the float crashed, and top_k/argsort routing
    was refused as "not a sum over the batch's rows")."""
    def body(carry, p):
        x, aux = carry
        probs = jax.nn.softmax(x @ p["wq"], axis=-1)
        if choose == "top_k":
            _, idx = lax.top_k(probs, 2)
            g = jnp.sum(probs * jax.nn.one_hot(idx[..., 0], probs.shape[-1]), -1)
        else:
            g = jnp.take_along_axis(probs, jnp.argsort(probs, -1), -1)[..., -1]
        return (x + jnp.tanh(x * g[..., None]) @ p["wo"], aux + jnp.mean(g)), None

    def step(params, batch):
        def loss(params):
            (out, aux), _ = lax.scan(body, (batch["x"], 0.0), params)
            return jnp.mean((out - batch["y"]) ** 2) + 0.1 * aux
        return jax.value_and_grad(loss)(params)

    return step


@pytest.mark.parametrize("choose", ["top_k", "argsort"])
def test_routed_auxiliary_loss_from_a_python_float_carry(choose):
    partitioned_matches_jit(_routed_aux_step(choose), (_init_stack(), _tokens_batch()),
                            [PP(4), BP()], what=f"aux loss routed by {choose}")


def _nonlinear_aux_step(params, batch):
    def body(carry, p):
        x, aux = carry
        h = jnp.tanh(x @ p["wq"])
        aux = jnp.maximum(aux, jnp.mean(h ** 2) ** 2)  # not a sum over examples
        return (x + h @ p["wo"], aux), None

    def loss(params):
        (out, aux), _ = lax.scan(body, (batch["x"], jnp.zeros(())), params)  # aux scan line
        return jnp.mean((out - batch["y"]) ** 2) + aux

    return jax.value_and_grad(loss)(params)


def test_batch_coupled_scalar_carry_is_exact_or_refused_by_line_and_leaf():
    """A carried scalar that is not a sum over examples (max of a squared batch mean) cannot
    be split into microbatches: jax.jit's numbers, or a PartitionError naming the scan's line
    in this file and the carry."""
    args = (_init_stack(), _tokens_batch())
    try:
        partitioned_matches_jit(_nonlinear_aux_step, args, [PP(4), BP()],
                                what="carry (x, max(aux, mean(h**2)**2))")
    except partir.PartitionError as e:
        line = _line_of(_nonlinear_aux_step, "# aux scan line")
        msg = str(e)
        assert f"{THIS_FILE}:{line}" in msg, f"refusal does not name {THIS_FILE}:{line}: {msg}"
        assert "carry" in msg.lower(), f"refusal does not name the carry leaf: {msg}"


def test_reverse_scan_is_supported_or_refused_naming_reverse():
    def step(params, batch):
        def body(h, p):
            return h + jnp.tanh(h @ p["wq"]) @ p["wo"], None

        def loss(params):
            out, _ = lax.scan(body, batch["x"], params, reverse=True)
            return jnp.mean((out - batch["y"]) ** 2)

        return jax.value_and_grad(loss)(params)

    args = (_init_stack(), _tokens_batch())
    try:
        partitioned_matches_jit(step, args, [PP(4), BP()], what="lax.scan(reverse=True)")
    except partir.PartitionError as e:
        assert "reverse" in str(e), f"a reverse scan refused without saying why: {e}"


# == 5. per-layer outputs independent of the activations =====================================

def _weight_ys_step(params, batch):
    """ys = each layer's weight sum and max (as nnx.scan returns each block's state)."""

    def body(h, p):
        return h + jnp.tanh(h @ p["wq"]) @ p["wo"], (p["wq"].sum(), jnp.abs(p["wo"]).max())

    def loss(params):
        out, ys = lax.scan(body, batch["x"], params)
        return jnp.mean((out - batch["y"]) ** 2) + 1e-3 * ys[0].sum(), ys

    (value, ys), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, ys, grads


def test_per_layer_outputs_of_the_weights_only_do_not_gather_the_stack():
    """Weight-only per-layer ys: jax.jit's numbers, and the stacked weights are never
    all-gathered over `stage` (each stage computes its own layers' ys)."""
    params = _init_stack()
    _, meta, _, _ = partitioned_matches_jit(_weight_ys_step, (params, _tokens_batch()),
                                            [PP(4), BP()],
                                            what="scan with weight-only per-layer ys")
    stacked = {f"params/{k}" for k in params} | {f"params['{k}']" for k in params}
    smallest = min(x.nbytes for x in jax.tree.leaves(params))
    offending = []
    for row in meta.tactics:
        for r in row.records:
            if str(r.kind) == "all_gather" and "stage" in r.axes and (
                    r.param in stacked or r.bytes >= smallest):
                offending.append(f"after {row.name}: {r.kind}{list(r.axes)} {r.bytes} B "
                                 f"param={r.param} op={r.op} at {r.source} ({r.reason})")
    assert not offending, ("the stacked weights are all-gathered over 'stage':\n"
                           + "\n".join(offending))
    counts = meta.tactics[0].collectives
    assert counts.get("all_permute", 0) >= 2, f"PP's row has no stage permutes: {counts}"


# == 5b. per-layer outputs computed from the activations ======================================

class SowingBlock(nn.Module):
    """An MLP block that sows its activations (row-wise) and an auxiliary loss (a mean over
    the batch's rows), as models sow intermediates for logging and MoE balancing losses."""

    @nn.compact
    def __call__(self, x, _):
        h = jax.nn.gelu(nn.Dense(F, name="up")(nn.LayerNorm(name="ln")(x)))
        self.sow("intermediates", "hidden", h)
        self.sow("intermediates", "aux", jnp.mean(h ** 2))
        return x + nn.Dense(D, name="down")(h), None


class SowingStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        blocks = nn.scan(SowingBlock, variable_axes={"params": 0, "intermediates": 0},
                         split_rngs={"params": True}, length=LAYERS)
        return blocks(name="blocks")(x, None)[0]


def _sowing_step(params, batch):
    model = SowingStack()

    def loss(params):
        out, state = model.apply({"params": params}, batch["x"], mutable=["intermediates"])
        sown = state["intermediates"]["blocks"]
        aux = sown["aux"][0].sum()
        return jnp.mean((out - batch["y"]) ** 2) + 0.1 * aux, sown

    (value, sown), grads = jax.value_and_grad(loss, has_aux=True)(params)
    # Metrics as users log them: each layer's mean activation, its aux loss.
    return value, grads, sown["hidden"][0].mean(axis=(1, 2)), sown["aux"][0]


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_sown_activations_and_auxiliary_losses_under_pp_bp(schedule):
    """Flax `sow` inside nn.scan under PP: per-layer outputs computed from the activations,
    row-wise ([L, B, F]) and a mean over the batch ([L]), each the unpipelined value. They
    were refused ("a pipelined loop returns per-layer outputs that depend only on the
    layers' own inputs")."""
    batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (16, D)),
             "y": jax.random.normal(jax.random.PRNGKey(2), (16, D))}
    params = SowingStack().init(jax.random.PRNGKey(0), batch["x"])["params"]
    pp = partir.tactic("PP", axis="stage", microbatches=4, schedule=schedule,
                       repeats=2 if schedule == "circular" else 1)
    partitioned_matches_jit(_sowing_step, (params, batch), [pp, BP()],
                            what=f"sown intermediates under [PP({schedule}), BP]")


def _ys_step(params, batch):
    """A plain scan whose ys hold the batch along dimension 1 and a sum over rows."""

    def body(h, p):
        a = jnp.tanh(h @ p["wq"])
        return h + a @ p["wo"], (a.transpose(1, 0, 2)[:, :, :3], jnp.sum(a[..., 0] ** 2))

    def loss(params):
        out, (rows, sums) = lax.scan(body, batch["x"], params, reverse=True)
        return jnp.mean((out - batch["y"]) ** 2) + 1e-2 * jnp.mean(rows ** 3) + 1e-3 * sums.sum()

    return jax.value_and_grad(loss)(params)


def test_per_layer_outputs_with_the_batch_inside_and_sums_over_rows():
    partitioned_matches_jit(_ys_step, (_init_stack(names=("wq", "wo")), _tokens_batch()),
                            [PP(4), BP()], what="row-wise and summed ys, reverse scan")
    partitioned_matches_jit(_ys_step, (_init_stack(names=("wq", "wo")), _tokens_batch(b=8)),
                            [PP(4)], mesh={"stage": 2}, what="PP alone")


def test_per_layer_outputs_mixing_rows_are_refused_by_leaf():
    """A per-layer output that is neither row-wise nor a sum over rows (each row minus the
    batch's mean) cannot be computed per microbatch: refused, naming the scan's ys leaf."""
    def step(params, batch):
        def body(h, p):
            a = jnp.tanh(h @ p["wq"])
            return h + a @ p["wo"], (p["wq"].sum(), a - a.mean(0))

        return lax.scan(body, batch["x"], params)[1][1].sum()

    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    with pytest.raises(partir.PartitionError, match=r"leaf 1 of the scan's ys.*mixes the "
                                                    r"batch's rows"):
        partir.jit(step, MESH, [PP(4), BP()])[0].lower(*args)


# == 6. `partir report` with a PP schedule ===================================================

def cli_step(params, batch):
    """The function `partir report --function` partitions (a scanned MLP stack)."""

    def body(h, p):
        return h + jnp.tanh(h @ p["wq"]) @ p["wo"], None

    def loss(params):
        out, _ = lax.scan(body, batch["x"], params)
        return jnp.mean((out - batch["y"]) ** 2)

    return jax.value_and_grad(loss)(params)


def cli_args():
    return jax.eval_shape(lambda: (_init_stack(names=("wq", "wo")), _tokens_batch()))


def test_partir_report_cli_with_pp_schedule(tmp_path, capsys):
    from partir_plugin.cli.main import main as partir_main

    schedule = [{"preset": "PP", "axis": "stage", "microbatches": 4},
                {"preset": "BP", "axis": "batch"}]
    out_json = tmp_path / "report.json"
    rc = partir_main(["report", "--function", f"{__file__}:cli_step",
                      "--args", f"{__file__}:cli_args", "--mesh", "stage=2,batch=4",
                      "--schedule-json", json.dumps(schedule), "--no-baseline",
                      "--json", str(out_json)])
    captured = capsys.readouterr()
    assert rc == 0, f"partir report exited {rc}:\n{captured.out[-3000:]}\n{captured.err[-3000:]}"
    assert "1 microbatches" not in captured.out, captured.out
    cli = {t["name"]: {k: v for k, v in t["collectives"].items() if v}
           for t in json.loads(out_json.read_text())["tactics"]}

    step, meta = partir.jit(cli_step, MESH, [PP(4), BP()])
    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    assert_close(step(*args), jax.jit(cli_step)(*args), what="cli_step under partir.jit")
    jit_counts = {t.name: {k: v for k, v in t.collectives.items() if v} for t in meta.tactics}
    assert cli == jit_counts, (f"partir report's collective counts {cli} differ from "
                               f"partir.jit's {jit_counts}")
    assert cli.get("PP", {}).get("all_permute", 0) >= 2, cli


# == 7. diagnostics: PP's collectives ========================================================

def _diag_step(params, batch):
    def body(h, p):
        return h + jnp.tanh(h @ p["wq"]) @ p["wo"], None

    def loss(params):
        out, _ = lax.scan(body, batch["x"], params)  # diag scan line
        return jnp.mean((out - batch["y"]) ** 2)

    return jax.value_and_grad(loss)(params)


def test_pp_permutes_are_credited_to_pp_at_a_user_line():
    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    _, meta, _, _ = partitioned_matches_jit(_diag_step, args, [PP(4), BP()])
    final = meta.tactics[-1]
    permutes = [r for r in final.records if str(r.kind) == "all_permute"]
    assert permutes, f"no collective_permute in the final program: {final.collectives}"
    described = "\n".join(f"  {r.kind}{list(r.axes)} tactic={r.tactic} source={r.source} "
                          f"op={r.op} reason={r.reason}" for r in permutes)
    assert all(r.tactic == "PP" for r in permutes), (
        f"stage permutes credited to another tactic:\n{described}")
    assert all("stage" in r.axes for r in permutes), described
    for r in permutes:
        assert r.source is not None, f"a PP permute has no source line:\n{described}"
        assert Path(r.source.file).name == THIS_FILE and "partir_plugin" not in r.source.file, (
            f"a PP permute is attributed to library code, not to the user's line:\n{described}")


def test_pp_permutes_have_forward_and_backward_phases():
    """One permute shifts the activations forward, its transpose shifts their cotangents
    back: the records say so (phase from jax's name stack), not `other`."""
    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    step, meta = partir.jit(_diag_step, MESH, [PP(4), BP()])
    step.lower(*args)
    phases = sorted(str(r.phase) for r in meta.tactics[0].records
                    if str(r.kind) == "all_permute")
    assert phases == ["backward", "forward"], f"PP's permutes have phases {phases}"


def test_pp_report_names_the_microbatches():
    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    step, meta = partir.jit(_diag_step, MESH, [PP(4), BP()])
    step.lower(*args)
    text = meta.report(detail=True)
    assert "1 microbatches" not in text, text
    pp_lines = [line for line in text.splitlines() if "pipeline" in line]
    assert pp_lines, f"no pipeline line in the report:\n{text}"
    assert any(re.search(r"\b4 microbatches\b", line) for line in pp_lines), (
        "the report's pipeline line does not say 4 microbatches:\n" + "\n".join(pp_lines))
    assert any("2 stages" in line for line in pp_lines), "\n".join(pp_lines)


# == 8. acceptance: the standard scanned Flax decoder trained with optax =====================

def test_acceptance_linen_decoder_dropout_causal_and_padding_masks():
    """[PP(M=4), BP] on {stage: 2, batch: 4}: an nn.scan(nn.remat(Block)) decoder with
    dropout 0.1 (split dropout rngs), a causal tril mask from a jitted helper and a padding
    mask broadcast to every layer, trained by an optax step (SGD with momentum: its update is
    linear in the gradients, so the parameters compare to the same tolerance): loss, every
    gradient, the new parameters and optimizer state equal jax.jit's with the same rng."""
    model = Decoder(dropout=0.1, remat=True)
    batch = _lm_batch()
    params = _lm_params(model, batch)
    tx = optax.sgd(0.1, momentum=0.9)

    def train_step(params, opt_state, batch, rng):
        loss, grads = jax.value_and_grad(_lm_loss, argnums=1)(model, params, batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    _, meta, _, _ = partitioned_matches_jit(
        train_step, (params, tx.init(params), batch, jax.random.PRNGKey(5)), [PP(4), BP()],
        what="acceptance: linen decoder, dropout 0.1, causal + padding masks")
    spec = meta.in_shardings[0]["blocks"]["up"]["kernel"].spec
    assert spec and spec[0] == "stage", f"stacked kernel not on its stages: {spec}"


# == 9. flax.nnx: nnx.scan over layers =======================================================

def _nnx_model(remat: bool = False):
    """`remat`: the function `nnx.scan` runs is wrapped in `nnx.remat` (the layer's state comes
    out of the checkpoint beside the activations)."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(D, F, rngs=rngs)
            self.down = nnx.Linear(F, D, rngs=rngs)
            self.norm = nnx.LayerNorm(D, rngs=rngs)

        def __call__(self, x, pad):
            h = self.down(nnx.gelu(self.up(self.norm(x))))
            return x + h * pad[..., None]

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Linear(D, D, rngs=rngs)

            @nnx.split_rngs(splits=LAYERS)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make_blocks(rngs):
                return Block(rngs)

            self.blocks = make_blocks(rngs)
            self.head = nnx.Linear(D, D, rngs=rngs)

        def __call__(self, x, pad):
            def run(block, h, pad):
                return block(h, pad)

            scanned = nnx.scan(nnx.remat(run) if remat else run,
                               in_axes=(0, nnx.Carry, None), out_axes=nnx.Carry)
            return self.head(scanned(self.blocks, self.embed(x), pad))

    return nnx, Model(nnx.Rngs(0))


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "nnx.remat"])
def test_nnx_scan_layers_under_pp_bp(remat):
    nnx, model = _nnx_model(remat)
    graphdef, params = nnx.split(model, nnx.Param)
    batch = {**_tokens_batch(), "pad": _padding_mask()}
    tx = optax.sgd(0.05)

    def train_step(params, opt_state, batch):
        def loss(p):
            out = nnx.merge(graphdef, p)(batch["x"], batch["pad"])
            return jnp.mean((out - batch["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, grads

    _, meta, _, _ = partitioned_matches_jit(train_step, (params, tx.init(params), batch),
                                            [PP(4), BP()],
                                            what=f"nnx.scan over 4 blocks (remat={remat})")
    kernels = [s for s in jax.tree.leaves(meta.in_shardings[0]["blocks"]) if s.spec]
    assert kernels and all(s.spec[0] == "stage" for s in kernels), (
        [s.spec for s in jax.tree.leaves(meta.in_shardings[0]["blocks"])])


def test_pp_stacked_gradient_reductions_name_their_parameter():
    """The layer loop's gradients, accumulated over microbatches and reduced once after it,
    name the stacked parameter they are the gradient of (no op of theirs reads it)."""
    args = (_init_stack(names=("wq", "wo")), _tokens_batch())
    step, meta = partir.jit(_diag_step, MESH, [PP(4), BP()])
    step(*args)
    after_loop = [r for r in meta.tactics[-1].records
                  if str(r.kind) == "all_reduce" and r.op == "stablehlo.while"]
    assert sorted(r.param for r in after_loop) == ["params/wo", "params/wq"], after_loop

"""The plain-JAX decoder that benchmarks/step_time.py adds as a third model family
(`benchmarks/decoder_lm.py`) partitions to jax.jit's numbers under BP+MP+Z3, unrolled and
scanned (its layers as one `lax.scan`). With SGD: AdamW turns rounding noise in near-zero
gradients into learning-rate-sized steps (benchmarks/external_models.py says the same)."""

import dataclasses

import benchmark_module
import jax
import optax
import pytest
from oracle import assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.models import megatron

pytestmark = pytest.mark.slow  # compiles a decoder train step twice

decoder_lm = benchmark_module.load("decoder_lm")


@pytest.mark.parametrize("scan", [False, True])
def test_decoder_bp_mp_z3_gives_jax_jit_numbers(scan):
    config = dataclasses.replace(decoder_lm.Config(layers=2, d_model=32, heads=4, ffw=64,
                                                   vocab=64, batch=8, seq_len=16), scan=scan)
    sgd = optax.sgd(0.1, momentum=0.9)
    args = decoder_lm.init(config, jax.random.PRNGKey(0), sgd)
    schedule = [partir.tactic("BP", axis="batch"),
                partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
                partir.tactic("Z3", axis="batch")]
    meta = assert_matches_jax_jit(decoder_lm.make_train_step(config, sgd), args,
                                  {"batch": 4, "model": 2}, schedule).meta
    # Megatron's rule found the decoder's kernels by their names.
    assert meta.in_shardings[0][("layers" if scan else "layer_0")]["mlp"]["dense_up"][
        "kernel"].spec[-1] == "model"

"""Flax (linen) + Optax versions of the PartIR paper's evaluation models (§7, appendix A.3),
plus a GShard/Mixtral-style mixture of experts (``moe``) for expert parallelism.

Every model module exposes the same interface so that benchmarks and tests can treat them
uniformly:

- ``Config`` dataclass with ``small()`` (tiny, for CPU tests) and ``paper()`` (the paper's sizes,
  for benchmarks only) classmethods;
- ``init(config, rng) -> (params, opt_state, batch)``;
- ``make_train_step(config) -> train_step(params, opt_state, batch) -> (params, opt_state, loss)``,
  an un-jitted function so that ``jax.jit`` or ``partir_plugin.jit`` can wrap it.

The inference transformer (``inference_transformer``) has no train step: its ``init`` returns
``(params, cache, batch)`` and ``make_serve(config)`` returns ``serve(params, cache, batch) ->
(tokens, cache)`` (see that module).

``params`` is always the inner dict Flax stores under ``"params"`` (a plain nested ``dict``); a
leaf's *path* is its keys joined by ``"/"``, e.g. ``"Block_0/attn/query/kernel"``
(see :func:`partir_plugin.models.common.param_paths`). Every leaf of ``batch`` has its batch
(or, for GNS, its node / edge) dimension first.
"""

"""Issue 18: every TMR entry of every op of the paper's models is a true equivalence
(`verify/tmr.py`). Apart from tests/test_tmr_verifier.py because it is the suite's longest test:
`--dist loadfile` then runs it beside the rest of the verifier's tests, not after them."""

from __future__ import annotations

import jax
import pytest
from tmr_corpus import assert_none_wrong, ops_of

from partir_plugin.extend import verify_registry
from partir_plugin.models import gns, inference_transformer, mlp, moe, transformer, unet
from partir_plugin.plugin.manager import default_registry

pytestmark = pytest.mark.slow  # probes every op of every model


def _model_ops(module, config):
    params, state, batch = module.init(config, jax.random.key(0))
    step = (module.make_serve(config) if module is inference_transformer
            else module.make_train_step(config))
    return ops_of(step, params, state, batch)


MODELS = [(transformer, transformer.Config.small()),
          (transformer, transformer.Config.small(scan=True)),
          (inference_transformer, inference_transformer.Config.small()),
          (unet, unet.Config.small()), (gns, gns.Config.small()), (mlp, mlp.Config.small()),
          (moe, moe.Config.small(layers=1))]
# The scanned transformer: attention, layer norm, Adam, a while loop, the embedding's gather
# and its scatter-add. The others' op families are in tests/test_tmr_verifier.py's generated
# tables (convolutions and pooling, indexing, reductions); `make test-all` probes every model.
REPRESENTATIVE = [MODELS[1]]


def _probe(models) -> None:
    # One corpus: an op the models share (Adam's updates, a layer norm) is probed once.
    ops = [op for module, config in models for op in _model_ops(module, config)]
    assert_none_wrong(verify_registry(ops, default_registry()))


def test_every_entry_of_the_scanned_transformers_ops_is_true():
    _probe(REPRESENTATIVE)


@pytest.mark.exhaustive
def test_every_entry_of_the_models_ops_is_true():
    _probe(MODELS)

"""The tests' oracle itself: its tolerance policy catches what it must and only that."""

import jax.numpy as jnp
import numpy as np
import optax
from oracle import ADAM_PARAMS_RTOL, RTOL, adam_step_parameters, mismatches


def _adam_step_output():
    params = {"w": jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32)}
    opt_state = optax.adam(1e-2).init(params)
    grads = {"w": jnp.linspace(-0.5, 0.5, 64, dtype=jnp.float32)}
    updates, opt_state = optax.adam(1e-2).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jnp.float32(3.0)


def _nudged(tree_leaf, relative):
    """`tree_leaf` with one entry moved by `relative` times the leaf's largest magnitude."""
    a = np.array(tree_leaf)
    a[5] += relative * np.abs(a).max()
    return jnp.asarray(a)


def test_an_adam_steps_parameters_get_the_adam_tolerance_and_its_moments_the_policy():
    params, (adam, empty), loss = _adam_step_output()
    want = (params, (adam, empty), loss)
    assert adam_step_parameters(want)
    # a parameter off by 10x the float32 policy, within the Adam tolerance: accepted
    off = {"w": _nudged(params["w"], 10 * RTOL[np.dtype(np.float32)])}
    assert mismatches((off, (adam, empty), loss), want) == []
    # beyond the Adam tolerance: caught
    far = {"w": _nudged(params["w"], 3 * ADAM_PARAMS_RTOL)}
    assert len(mismatches((far, (adam, empty), loss), want)) == 1
    # a moment off by 10x the policy: caught (the moments carry the gradient)
    mu = {"w": _nudged(adam.mu["w"], 10 * RTOL[np.dtype(np.float32)])}
    assert len(mismatches((params, (adam._replace(mu=mu), empty), loss), want)) == 1
    # an explicit rtol applies to every leaf, the parameters too
    assert len(mismatches((off, (adam, empty), loss), want,
                          rtol=RTOL[np.dtype(np.float32)])) == 1


def test_outputs_without_an_adam_state_are_compared_to_the_policy():
    params, (adam, empty), loss = _adam_step_output()
    off = {"w": _nudged(params["w"], 10 * RTOL[np.dtype(np.float32)])}
    assert not adam_step_parameters((params, loss))
    assert len(mismatches((off, loss), (params, loss))) == 1
    sgd_state = optax.sgd(1e-2).init(params)
    assert not adam_step_parameters((params, sgd_state, loss))
    assert len(mismatches((off, sgd_state, loss), (params, sgd_state, loss))) == 1


def test_bfloat16_parameters_of_an_adam_step_keep_their_dtypes_looser_tolerance():
    params, state, loss = _adam_step_output()
    half = {"w": params["w"].astype(jnp.bfloat16)}
    off = {"w": _nudged(half["w"], 3e-3)}  # within bf16's 1e-2, beyond ADAM_PARAMS_RTOL
    assert mismatches((off, state, loss), (half, state, loss)) == []

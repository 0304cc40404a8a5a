"""A table of convolution, window and data-movement programs for the TMR verifier and the
spatial-tiling regression tests: each is a loss of one or two arrays, differentiated, so the
corpus holds the forward ops and their transposes (input- and weight-gradient convolutions,
`select_and_scatter` for max pooling, `pad` for `slice`, scatter for gather, ...)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclass(frozen=True)
class Case:
    """`loss(*args) -> scalar` on arguments of `shapes`; `spatial` names (arg, dim) pairs a
    schedule may tile to put a window or data-movement op across tiles."""

    name: str
    loss: Callable
    shapes: tuple[tuple[int, ...], ...]
    spatial: tuple[tuple[int, int], ...] = ()
    int_args: tuple[int, ...] = ()  # arguments holding indices

    def args(self, seed: int = 0) -> list[jax.Array]:
        rng = np.random.default_rng(seed)
        out = []
        for i, s in enumerate(self.shapes):
            if i in self.int_args:
                out.append(jnp.asarray(rng.integers(0, 16, s), jnp.int32))
            else:
                out.append(jnp.asarray(rng.normal(size=s), jnp.float32))
        return out

    def step(self) -> Callable:
        float_args = tuple(i for i in range(len(self.shapes)) if i not in self.int_args)
        return jax.value_and_grad(self.loss, argnums=float_args)


def _conv(padding, strides=(1, 1), lhs_dil=(1, 1), rhs_dil=(1, 1), groups=1, batch_groups=1,
          dims=("NHWC", "HWIO", "NHWC")):
    def loss(img, ker):
        y = lax.conv_general_dilated(img, ker, strides, padding, lhs_dilation=lhs_dil,
                                     rhs_dilation=rhs_dil, dimension_numbers=dims,
                                     feature_group_count=groups,
                                     batch_group_count=batch_groups)
        return (y ** 2).sum()
    return loss


def _pool(kind, window, strides, padding):
    def loss(x):
        if kind == "max":
            y = lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
        else:
            y = lax.reduce_window(x, 0.0, lax.add, window, strides, padding) / np.prod(window)
        return (y ** 2).sum()
    return loss


IMG, KER = (2, 16, 16, 4), (3, 3, 4, 8)
CASES = [
    Case("conv_same", _conv("SAME"), (IMG, KER), ((0, 1), (0, 2))),
    Case("conv_valid", _conv("VALID"), (IMG, KER), ((0, 1),)),
    Case("conv_asym_pad", _conv(((2, 0), (0, 1))), (IMG, KER), ((0, 1),)),
    Case("conv_stride2", _conv("SAME", strides=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_lhs_dilation", _conv(((1, 1), (1, 1)), lhs_dil=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_rhs_dilation", _conv("SAME", rhs_dil=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_feature_groups", _conv("SAME", groups=2), (IMG, (3, 3, 2, 8)), ((0, 1), (0, 3))),
    Case("conv_batch_groups", _conv("VALID", batch_groups=2), ((4, 8, 8, 4), (3, 3, 4, 8)),
         ((0, 1),)),
    Case("conv_1x1", _conv("VALID"), (IMG, (1, 1, 4, 8)), ((0, 1),)),
    Case("conv_whole_window", _conv("VALID"), ((2, 8, 8, 4), (8, 8, 4, 8)), ((0, 1), (1, 0))),
    Case("conv_nchw", _conv("SAME", dims=("NCHW", "OIHW", "NCHW")), ((2, 4, 16, 16),
         (8, 4, 3, 3)), ((0, 2),)),
    Case("conv_1d", _conv("SAME", strides=(1,), lhs_dil=(1,), rhs_dil=(1,),
                          dims=("NWC", "WIO", "NWC")), ((2, 16, 4), (5, 4, 4)), ((0, 1),)),
    Case("max_pool", _pool("max", (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (IMG,), ((0, 1),)),
    Case("max_pool_same", _pool("max", (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), (IMG,), ((0, 1),)),
    Case("avg_pool", _pool("avg", (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (IMG,), ((0, 1),)),
    Case("avg_pool_overlap", _pool("avg", (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (IMG,),
         ((0, 1),)),
    Case("cumsum", lambda x: (jnp.cumsum(x, axis=1) ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("cummax", lambda x: (lax.cummax(x, axis=1) ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("pad_edges", lambda x: (jnp.pad(x, ((0, 0), (3, 1))) ** 2 * jnp.arange(20.0)).sum(),
         ((4, 16),), ((0, 1),)),
    Case("pad_interior", lambda x: (lax.pad(x, 0.5, ((0, 0, 0), (1, -1, 1))) ** 2
                                    * jnp.arange(31.0)).sum(), ((4, 16),), ((0, 1),)),
    Case("slice_strided", lambda x: (x[:, 1::2] ** 2 * jnp.arange(8.0)).sum(), ((4, 16),),
         ((0, 1),)),
    Case("slice_window", lambda x: (x[:, 2:10] ** 3).sum(), ((4, 16),), ((0, 1),)),
    Case("reverse", lambda x: (x[:, ::-1] * jnp.arange(16.0)).sum(), ((4, 16),), ((0, 1),)),
    Case("concatenate", lambda x, y: (jnp.concatenate([x, y], 1) ** 2
                                      * jnp.arange(32.0)).sum(), ((4, 16), (4, 16)),
         ((0, 1), (1, 1))),
    Case("roll", lambda x: (jnp.roll(x, 3, axis=1) * jnp.arange(16.0)).sum(), ((4, 16),),
         ((0, 1),)),
    Case("gather_rows", lambda t, i: (t[i] ** 2).sum(), ((16, 8), (4, 6)), ((0, 0), (0, 1)),
         int_args=(1,)),
    Case("take_along_axis", lambda x, i: (jnp.take_along_axis(x, i % 16, axis=1) ** 2).sum(),
         ((4, 16), (4, 16)), ((0, 1), (0, 0)), int_args=(1,)),
    Case("scatter_add", lambda x, i: (x.at[:, i[0] % 16].add(1.0) ** 2
                                      * jnp.arange(16.0)).sum(), ((4, 16), (1, 5)), ((0, 1),),
         int_args=(1,)),
    Case("scatter_set", lambda x, i: (x.at[:, i[0] % 16].set(2.0) ** 2).sum(),
         ((4, 16), (1, 5)), ((0, 1),), int_args=(1,)),
    Case("sort", lambda x: (jnp.sort(x, axis=1) * jnp.arange(16.0)).sum(), ((4, 16),),
         ((0, 1), (0, 0))),
    Case("argsort", lambda x: (x * jnp.argsort(x, axis=1)).sum(), ((4, 16),), ((0, 1),)),
    Case("argmax", lambda x: (x * jnp.argmax(x, axis=1)[:, None]).sum(), ((4, 16),), ((0, 1),)),
    Case("logsumexp", lambda x: jax.nn.logsumexp(x, axis=1).sum(), ((4, 16),), ((0, 1),)),
    Case("reduce_window_sum_rows", lambda x: (lax.reduce_window(
        x, 0.0, lax.add, (1, 4), (1, 4), "VALID") ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("dynamic_slice", lambda x, i: (lax.dynamic_slice_in_dim(x, i[0, 0] % 8, 8, 1)
                                        ** 2).sum(), ((4, 16), (1, 1)), ((0, 1), (0, 0)),
         int_args=(1,)),
    Case("top_k", lambda x: (lax.top_k(x, 4)[0] ** 2).sum(), ((4, 16),), ((0, 1), (0, 0))),
]

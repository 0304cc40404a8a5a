"""Do models written with other JAX frontends partition to jax.jit's numbers?

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/external_models.py

For each frontend (Flax linen, Flax NNX with ``nnx.scan``, Haiku, Equinox, Keras 3 on JAX,
PyTorch through torchax, jraph) a small model is written in that library's own idiom with a
train step ``(params, opt_state, batch) -> (params, opt_state, loss, grads)``. Each is
partitioned by ``partir_plugin.jit`` on a ``{"batch": 4, "model": 2}`` mesh under BP, BP+Z3 and
(where it has dense layers) BP+MP with a Megatron rule, run for two steps beside
``jax.jit(train_step)`` on one device from the same inputs, and its losses, gradients and
final parameters compared. One case per frontend also runs the partitioned step inside the
user's own ``jax.jit``. Optimizers are SGD with momentum: Adam divides near-zero gradients by
their own magnitude and so amplifies rounding noise past any useful tolerance.

Frontends that are not installed (or fail to import) are reported as skipped; the script exits
non-zero if any check fails.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")  # must be set before keras is imported

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import partir_plugin as partir  # noqa: E402

PyTree = Any
Rule = Callable[[str, tuple[int, ...]], int | None]
TrainStep = Callable[[PyTree, PyTree, PyTree], tuple[PyTree, PyTree, jax.Array, PyTree]]

MESH = {"batch": 4, "model": 2}
STEPS = 2
LOSS_TOL = 1e-5  # relative: float reassociation of a sum over the batch
TREE_TOL = 1e-4  # relative to each leaf's largest magnitude (gradients, parameters)
BATCH, FEATURES, HIDDEN, CLASSES = 16, 8, 16, 4
LEARNING_RATE, MOMENTUM = 0.1, 0.9


class Skip(Exception):
    """A frontend that cannot run here (not installed, or its import fails)."""


@dataclass
class Program:
    """A frontend's train step, the inputs of its first step, and its Megatron rule."""

    train_step: TrainStep
    params: PyTree
    opt_state: PyTree
    batch: PyTree
    megatron_rule: Rule | None = None


@dataclass
class Row:
    """One line of the result table."""

    frontend: str
    schedule: str
    collectives: str = "-"
    loss_diff: float = float("nan")
    grads_diff: float = float("nan")
    params_diff: float = float("nan")
    status: str = "FAIL"
    note: str = ""


@dataclass
class Schedule:
    name: str
    tactics: list = field(default_factory=list)
    in_user_jit: bool = False


def _import(module: str) -> Any:
    """Import a frontend module, turning any failure into `Skip` with the reason."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise Skip(f"skipped: not installed ({e.name})") from None
    except Exception as e:  # an incompatible install fails in many ways
        raise Skip(f"skipped: `import {module}` failed: {type(e).__name__}: {e}") from None


def _data(key: int = 0) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(key))
    x = jax.random.normal(kx, (BATCH, FEATURES), jnp.float32)
    y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
    return x, y


def _xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _optax_step(loss_fn: Callable[[PyTree, PyTree], jax.Array], optimizer) -> TrainStep:
    """The usual optax train step around `loss_fn(params, batch)`."""
    import optax

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    return train_step


def _sgd():
    import optax

    return optax.sgd(LEARNING_RATE, momentum=MOMENTUM)


# --- frontends -------------------------------------------------------------------------------


def flax_linen() -> Program:
    """A linen MLP (``@nn.compact``, ``model.apply({"params": p}, x)``)."""
    nn = _import("flax.linen")

    class MLP(nn.Module):
        hidden: int = HIDDEN
        layers: int = 4

        @nn.compact
        def __call__(self, x):
            for _ in range(self.layers - 1):
                x = nn.relu(nn.Dense(self.hidden)(x))
            return nn.Dense(CLASSES)(x)

    model, (x, y) = MLP(), _data()
    params = model.init(jax.random.PRNGKey(1), x)["params"]
    optimizer = _sgd()

    def loss_fn(p, batch):
        return _xent(model.apply({"params": p}, batch["x"]), batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """Dense_{even}: column-parallel (split outputs); Dense_{odd}: row-parallel."""
        if not path.endswith("kernel"):
            return None
        return 1 if int(path.split("/")[0].split("_")[-1]) % 2 == 0 else 0

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"x": x, "y": y}, rule)


def flax_nnx_scan() -> Program:
    """NNX residual blocks created with ``nnx.vmap`` and run with ``nnx.scan`` over layers;
    the train step merges the graph def with the parameter ``State`` (``nnx.split``)."""
    nnx = _import("flax.nnx")
    layers = 3

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(HIDDEN, 2 * HIDDEN, rngs=rngs)
            self.down = nnx.Linear(2 * HIDDEN, HIDDEN, rngs=rngs)

        def __call__(self, x):
            return x + self.down(nnx.relu(self.up(x)))

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)

            @nnx.split_rngs(splits=layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make_blocks(rngs):
                return Block(rngs)

            self.blocks = make_blocks(rngs)
            self.head = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
            def run(block, h):
                return block(h)

            return self.head(run(self.blocks, self.embed(x)))

    graphdef, params = nnx.split(Model(nnx.Rngs(1)), nnx.Param)
    x, y = _data()
    optimizer = _sgd()

    def loss_fn(p, batch):
        return _xent(nnx.merge(graphdef, p)(batch["x"]), batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """Inside each block ``up`` splits its outputs, ``down`` its inputs (leading [L])."""
        path = path.removesuffix("/value")
        if path.endswith("up/kernel"):
            return len(shape) - 1
        if path.endswith("down/kernel"):
            return len(shape) - 2
        return None

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"x": x, "y": y}, rule)


def haiku() -> Program:
    """``hk.transform`` of an ``hk.nets.MLP``, applied with ``model.apply(params, None, x)``."""
    hk = _import("haiku")

    def forward(x):
        return hk.nets.MLP([HIDDEN, HIDDEN, HIDDEN, CLASSES])(x)

    model = hk.without_apply_rng(hk.transform(forward))
    x, y = _data()
    params = model.init(jax.random.PRNGKey(1), x)
    optimizer = _sgd()

    def loss_fn(p, batch):
        return _xent(model.apply(p, batch["x"]), batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """``mlp/~/linear_{even}/w [in, out]``: column-parallel; odd: row-parallel."""
        if not path.endswith("/w"):
            return None
        return 1 if int(path.split("/")[-2].split("_")[-1]) % 2 == 0 else 0

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"x": x, "y": y}, rule)


def equinox() -> Program:
    """An ``eqx.Module`` of ``eqx.nn.Linear`` layers, ``jax.vmap``-ed over the batch; the
    arrays are split from the static parts with ``eqx.partition`` and recombined inside."""
    eqx = _import("equinox")

    class MLP(eqx.Module):
        layers: list

        def __init__(self, key):
            sizes = [FEATURES, HIDDEN, HIDDEN, HIDDEN, CLASSES]
            keys = jax.random.split(key, len(sizes) - 1)
            self.layers = [eqx.nn.Linear(i, o, key=k)
                           for i, o, k in zip(sizes[:-1], sizes[1:], keys)]

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    params, static = eqx.partition(MLP(jax.random.PRNGKey(1)), eqx.is_array)
    x, y = _data()
    optimizer = _sgd()

    def loss_fn(p, batch):
        return _xent(jax.vmap(eqx.combine(p, static))(batch["x"]), batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """``layers/{i}/weight [out, in]``: even layers split outputs (0), odd inputs (1)."""
        if not path.endswith("weight"):
            return None
        return 0 if int(path.split("/")[1]) % 2 == 0 else 1

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"x": x, "y": y}, rule)


def keras() -> Program:
    """A ``keras.Sequential`` trained the Keras-3-on-JAX way: ``model.stateless_call`` and
    ``optimizer.stateless_apply`` on lists of variable values (Keras's own SGD)."""
    keras = _import("keras")
    if keras.backend.backend() != "jax":
        raise Skip(f"skipped: KERAS_BACKEND is {keras.backend.backend()!r}, not 'jax'")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((FEATURES,))]
                             + [keras.layers.Dense(HIDDEN, activation="relu") for _ in range(3)]
                             + [keras.layers.Dense(CLASSES)])
    optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    optimizer.build(model.trainable_variables)
    names = [v.path for v in model.trainable_variables]
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss_fn(trainable, batch):
        logits, _ = model.stateless_call(trainable, non_trainable, batch["x"])
        return loss_object(batch["y"], logits)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        params, opt_state = optimizer.stateless_apply(opt_state, grads, params)
        return params, opt_state, loss, grads

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """``.../dense{,_1,_2,_3}/kernel [in, out]``: even layers column-, odd row-parallel."""
        name = names[int(path)]
        if not name.endswith("kernel"):
            return None
        layer = name.split("/")[-2]
        index = int(layer.split("_")[-1]) if "_" in layer else 0
        return 1 if index % 2 == 0 else 0

    x, y = _data()
    params = [v.value for v in model.trainable_variables]
    opt_state = [v.value for v in optimizer.variables]
    return Program(train_step, params, opt_state, {"x": x, "y": y}, rule)


def torchax() -> Program:
    """A ``torch.nn.Module`` run functionally by torchax: its ``state_dict`` as JAX arrays,
    the forward a ``torch.func.functional_call`` wrapped by ``torchax.interop.jax_view``."""
    torch = _import("torch")
    tx = _import("torchax")
    interop = _import("torchax.interop")

    torch.manual_seed(1)
    module = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES))
    env = tx.default_env()
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in module.state_dict().items()}

    def forward(state, x):
        return torch.func.functional_call(module, state, (x,))

    jax_forward = interop.jax_view(forward)
    x, y = _data()
    optimizer = _sgd()

    def loss_fn(p, batch):
        with env:
            logits = jax_forward(p, batch["x"])
        return _xent(logits, batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """``{i}.weight [out, in]`` of the Linear layers (0, 2, 4, 6): the first and third
        split outputs (0), the second and fourth inputs (1)."""
        if not path.endswith(".weight"):
            return None
        return 0 if int(path.split(".")[0]) % 4 == 0 else 1

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"x": x, "y": y}, rule)


def jraph() -> Program:
    """A ``jraph.GraphNetwork`` with Flax linen update MLPs (the Flax ogbg example's style),
    classifying a ``jraph.batch`` of 8 small graphs from their pooled globals."""
    jraph = _import("jraph")
    nn = _import("flax.linen")
    graphs, nodes, edges = 8, 4, 8

    class MLP(nn.Module):
        out: int

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.out)(nn.relu(nn.Dense(HIDDEN)(x)))

    class GraphNet(nn.Module):
        @nn.compact
        def __call__(self, graph):
            def edge_fn(e, s, r, g):
                return MLP(HIDDEN, name="edge_mlp")(jnp.concatenate([e, s, r, g], -1))

            def node_fn(n, sent, received, g):
                return MLP(HIDDEN, name="node_mlp")(jnp.concatenate([n, sent, received, g], -1))

            def global_fn(n, e, g):
                return MLP(CLASSES, name="global_mlp")(jnp.concatenate([n, e, g], -1))

            net = jraph.GraphNetwork(update_edge_fn=edge_fn, update_node_fn=node_fn,
                                     update_global_fn=global_fn)
            return net(graph).globals

    rng = np.random.default_rng(0)
    graph_list = [jraph.GraphsTuple(
        nodes=rng.normal(size=(nodes, FEATURES)).astype(np.float32),
        edges=rng.normal(size=(edges, FEATURES)).astype(np.float32),
        senders=rng.integers(0, nodes, edges).astype(np.int32),
        receivers=rng.integers(0, nodes, edges).astype(np.int32),
        n_node=np.array([nodes], np.int32), n_edge=np.array([edges], np.int32),
        globals=np.zeros((1, FEATURES), np.float32)) for _ in range(graphs)]
    graph = jax.tree.map(jnp.asarray, jraph.batch(graph_list))
    labels = jnp.asarray(rng.integers(0, CLASSES, graphs).astype(np.int32))
    model = GraphNet()
    params = model.init(jax.random.PRNGKey(1), graph)["params"]
    optimizer = _sgd()

    def loss_fn(p, batch):
        return _xent(model.apply({"params": p}, batch["graph"]), batch["y"])

    def rule(path: str, shape: tuple[int, ...]) -> int | None:
        """In each update MLP ``Dense_0`` splits its outputs, ``Dense_1`` its inputs."""
        if path.endswith("Dense_0/kernel"):
            return 1
        if path.endswith("Dense_1/kernel"):
            return 0
        return None

    return Program(_optax_step(loss_fn, optimizer), params, optimizer.init(params),
                   {"graph": graph, "y": labels}, rule)


FRONTENDS: dict[str, Callable[[], Program]] = {
    "flax.linen": flax_linen,
    "flax.nnx (nnx.scan)": flax_nnx_scan,
    "haiku": haiku,
    "equinox": equinox,
    "keras (jax)": keras,
    "torchax": torchax,
    "jraph": jraph,
}


# --- checking --------------------------------------------------------------------------------


def schedules(program: Program) -> list[Schedule]:
    """BP, BP+Z3 (also run inside a user's jax.jit) and, with a Megatron rule, BP+MP."""
    bp = partir.tactic("BP", axis="batch")
    z3 = partir.tactic("Z3", axis="batch")
    out = [Schedule("BP", [bp]), Schedule("BP+Z3", [bp, z3])]
    if program.megatron_rule is not None:
        out.append(Schedule("BP+MP", [bp, partir.tactic("MP", program.megatron_rule,
                                                        axis="model")]))
    out.append(Schedule("BP+Z3 in jax.jit", [bp, z3], in_user_jit=True))
    return out


def rel_diff(got: PyTree, want: PyTree) -> float:
    """The largest ``max|got - want| / max|want|`` over the leaves (floored at 1e-6)."""
    worst = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return float("inf")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))),
                                                                  1e-6))
    return worst


def run_steps(step: Callable, program: Program) -> list[tuple]:
    """`STEPS` train steps from the program's inputs, every output blocked on."""
    params, opt_state, outputs = program.params, program.opt_state, []
    for _ in range(STEPS):
        params, opt_state, loss, grads = jax.block_until_ready(
            step(params, opt_state, program.batch))
        outputs.append((params, opt_state, loss, grads))
    return outputs


def fmt_collectives(counts: dict[str, int]) -> str:
    short = {"all_gather": "ag", "all_reduce": "ar", "reduce_scatter": "rs",
             "all_to_all": "a2a", "all_permute": "perm"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in counts.items() if v) or "none"


def check(frontend: str, program: Program, schedule: Schedule,
          reference: list[tuple]) -> Row:
    """Partition the program with `schedule`, run it and compare with `reference`."""
    row = Row(frontend, schedule.name)
    try:
        step, meta = partir.jit(program.train_step, MESH, schedule.tactics)
        call = jax.jit(lambda *a: step(*a)) if schedule.in_user_jit else step
        outputs = run_steps(call, program)
        row.collectives = fmt_collectives(meta.tactics[-1].collectives)
    except Exception as e:  # the table reports every failure
        row.note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
        return row
    row.loss_diff = max(rel_diff(o[2], r[2]) for o, r in zip(outputs, reference))
    row.grads_diff = max(rel_diff(o[3], r[3]) for o, r in zip(outputs, reference))
    row.params_diff = rel_diff(outputs[-1][0], reference[-1][0])
    ok = (row.loss_diff <= LOSS_TOL and row.grads_diff <= TREE_TOL
          and row.params_diff <= TREE_TOL)
    devices = len(outputs[-1][2].sharding.device_set)
    if devices != jax.device_count():  # guard against a silent unpartitioned fallback
        ok, row.note = False, f"the loss lives on {devices} devices, not the whole mesh"
    row.status = "OK" if ok else "FAIL"
    return row


def check_frontend(frontend: str, make: Callable[[], Program]) -> list[Row]:
    """Every schedule for one frontend, or one skipped/failed row if it cannot be built."""
    try:
        program = make()
        reference = run_steps(jax.jit(program.train_step), program)
    except Skip as e:
        return [Row(frontend, "-", status="SKIP", note=str(e))]
    except Exception as e:  # a broken model is a failure of this script
        traceback.print_exc()
        return [Row(frontend, "-", note=f"building the model: {type(e).__name__}: {e}")]
    return [check(frontend, program, schedule, reference) for schedule in schedules(program)]


def table(rows: Sequence[Row]) -> str:
    head = ("frontend", "schedule", "collectives (last tactic)", "loss", "grads", "params",
            "result")
    lines = [head] + [(r.frontend, r.schedule, r.collectives, f"{r.loss_diff:.1e}",
                       f"{r.grads_diff:.1e}", f"{r.params_diff:.1e}",
                       r.status + (f"  {r.note}" if r.note else "")) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1]
                     for line in lines)


def main(argv: Sequence[str] = ()) -> int:
    """Run the frontends named in `argv` (all when empty); 1 if any check failed."""
    if jax.device_count() < 8:
        print(f"needs 8 devices, have {jax.device_count()}: set XLA_FLAGS="
              f"--xla_force_host_platform_device_count=8 before jax starts")
        return 2
    chosen = {k: v for k, v in FRONTENDS.items() if not argv or any(a in k for a in argv)}
    rows: list[Row] = []
    for frontend, make in chosen.items():
        start = time.perf_counter()
        rows.extend(check_frontend(frontend, make))
        print(f"{frontend}: {time.perf_counter() - start:.1f} s", flush=True)
    print()
    print(f"mesh {MESH}, {STEPS} steps, relative max diff vs jax.jit on one device "
          f"(loss <= {LOSS_TOL:g}; grads, params <= {TREE_TOL:g})")
    print(table(rows))
    failed = [r for r in rows if r.status == "FAIL"]
    passed = sum(r.status == "OK" for r in rows)
    print(f"\n{passed} passed, {len(failed)} failed, {len(rows) - passed - len(failed)} skipped"
          + "".join(f"\n  FAIL {r.frontend} / {r.schedule}: {r.note}" for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

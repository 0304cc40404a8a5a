"""The cost model's vocabulary: hardware specs, collective costs, timelines, simulation
results and the `Simulator` protocol.

Hardware specs and simulators are plugins (`partir_add_hardware`, `partir_add_simulators`); this
module only defines the data they exchange, so reports, searchers and third-party simulators
share one vocabulary without importing each other. Finding them by name goes through the plugin
manager (`plugin/resolve.py`), which this module does not import.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from .core.mesh import Mesh
from .core.subaxis import parent_of


@dataclass(frozen=True)
class LinkClass:
    """A class of interconnect (NVLink, ICI, network...). `bandwidth_bytes_per_s` is what one
    device can push in one direction around a ring over this link class; `latency_s` is paid
    once per ring step; `overhead_s` once per collective, whatever its group size (the
    rendezvous of XLA:CPU's in-process collectives: `partir calibrate` measures it from
    all-reduces over groups of two and of every device; 0 for the datasheet specs)."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    overhead_s: float = 0.0


# The platforms jax lowers for (`lowering_platforms`), a `HardwareSpec.platform`.
PLATFORMS = frozenset({"cpu", "cuda", "rocm", "tpu"})


@dataclass(frozen=True)
class HardwareSpec:
    """What one device of a mesh can do. All figures are per device (per core on TPU).

    `flops_per_s` maps an MLIR element type ("f32", "bf16", ...) to the matrix-unit peak used for
    `dot_general`/`convolution`; `vector_flops_per_s` (when set) is the peak for everything else
    (elementwise work does not run on tensor cores). `axis_links` maps a mesh axis name to a key of
    `links` (e.g. {"hosts": "network"}); axes not listed use `default_link`.
    `kernel_overhead_s` is a fixed cost per launched kernel (fusion): launch, dispatch and the
    gap between kernels. `matrix_efficiency` is the fraction of the matrix peak a large GEMM
    reaches, `matrix_half_flops` the size (flops) at which a GEMM reaches half of that (small
    GEMMs are far from peak); `memory_efficiency` the fraction of peak memory bandwidth a
    streaming kernel reaches. With the defaults (0, 1, 0, 1) a kernel is the datasheet
    roofline; GPU specs set all four (docs/simulator.md). `duplicates_expensive_ops` says how
    the backend fuses an expensive elementwise op (exp, tanh, divide, ...) read by several
    kernels: True, into each of them (XLA:GPU's priority fusion, when its cost model allows: the
    simulator's H100 peak memory matches XLA's only so), or False, once, in a kernel of its own
    whose result is materialised (XLA:CPU's instruction fusion; docs/simulator.md).
    `library_reductions`: reductions run as library fusions that take in a producer only when
    no other kernel reads it (XLA:CPU's YNNPACK reductions), so such a producer is materialised.
    `combined_collectives` (kinds such as "all_reduce") and `combine_threshold_bytes`: the
    backend's collective combiners send independent collectives of those kinds over the same
    devices as one, up to that many bytes (XLA's AllReduceCombiner and friends; 0: none).

    The cluster (docs/simulator.md, "Clusters"): `devices_per_node` devices share a node; the
    mesh's devices fill nodes in order (replica r on node r // devices_per_node, the mesh
    row-major, so minor axes fill a node first). `intra_node_link` (a key of `links`; None:
    `default_link`) joins the devices of a node, `inter_node_link` (a key of `links`) the
    nodes, given per device: the node's NIC bandwidth divided by its devices (DGX A100: 8 x
    200 Gb/s for 8 GPUs, 25 GB/s). A collective whose device groups stay within a node runs on
    the intra-node link; one whose groups cross nodes runs on the inter-node link, each group
    using the NICs of its g members in a node (`g x` the per-device bandwidth, at most the
    intra-node link's) and paying the slower latency (`link_for_axes` with a mesh).
    `axis_links` overrides the mapping for the axes it names; without `devices_per_node`
    every axis uses `axis_links` or `default_link` (one node of any size).

    `cache_bytes` and `cache_bandwidth_bytes_per_s`: a kernel that reads and writes at most
    `cache_bytes` streams at the cache's bandwidth instead (a device's share of a CPU's
    last-level cache: virtual devices' kernels interleave on its cores; `partir calibrate`
    measures both); 0: one bandwidth.

    `host_link`: the link between a device and its host's memory (PCIe), over which RM's
    offload moves saved activations to host memory and back; None: no estimate of offload.

    `rendezvous_wait`: devices that time-share fewer cores (virtual CPU devices: 8 threads on
    a host's 2 cores) drift apart while they compute, as the OS scheduler runs some before
    others, and a collective waits for its group's last member. It maps a group size to the
    fraction of the compute since the device last took part in a collective that such a
    collective waits beyond its link cost (a group size not listed takes the largest listed
    below it); `partir calibrate` measures it. Empty: devices run on their own cores.

    `platform`: the jax platform the device runs ("cuda", "tpu", "cpu"; None: unknown). An
    estimate made without running (`partir.estimate`, the planner) lowers the program for it,
    as that device would run it: jax lowers some ops per platform (its random bits as a rolled
    loop on CPU, unrolled on GPU; moves to host memory only on GPU and TPU).
    """

    name: str
    flops_per_s: dict[str, float]
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    links: dict[str, LinkClass]
    default_link: str
    axis_links: dict[str, str] = field(default_factory=dict)
    vector_flops_per_s: float | None = None
    kernel_overhead_s: float = 0.0
    matrix_efficiency: float = 1.0
    matrix_half_flops: float = 0.0
    memory_efficiency: float = 1.0
    duplicates_expensive_ops: bool = True
    library_reductions: bool = False
    combined_collectives: tuple[str, ...] = ()
    combine_threshold_bytes: int = 0
    devices_per_node: int | None = None
    intra_node_link: str | None = None
    inter_node_link: str | None = None
    host_link: LinkClass | None = None
    platform: str | None = None
    cache_bytes: int = 0
    cache_bandwidth_bytes_per_s: float | None = None
    rendezvous_wait: dict[int, float] = field(default_factory=dict)
    notes: str = ""
    # Other names people type for this spec ("a100", "A100"); matched case-insensitively.
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.flops_per_s:
            raise ValueError(f"hardware {self.name!r}: flops_per_s is empty")
        if self.platform is not None and self.platform not in PLATFORMS:
            # jax lowers for any name it is given (its generic rules): a typo would pass
            raise ValueError(f"hardware {self.name!r}: unknown platform {self.platform!r} "
                             f"(jax's: {', '.join(sorted(PLATFORMS))}; None: this process's)")
        if self.default_link not in self.links:
            raise ValueError(f"hardware {self.name!r}: default_link {self.default_link!r} is not "
                             f"one of its links {sorted(self.links)}")
        for axis, link in self.axis_links.items():
            if link not in self.links:
                raise ValueError(f"hardware {self.name!r}: axis {axis!r} maps to unknown link "
                                 f"{link!r} (links: {sorted(self.links)})")
        if self.devices_per_node is not None:
            if self.devices_per_node < 1:
                raise ValueError(f"hardware {self.name!r}: devices_per_node must be >= 1, got "
                                 f"{self.devices_per_node}")
            for role in ("intra_node_link", "inter_node_link"):
                link = getattr(self, role)
                if link is None and role == "intra_node_link":
                    continue
                if link not in self.links:
                    raise ValueError(f"hardware {self.name!r}: {role} {link!r} is not one of "
                                     f"its links {sorted(self.links)} (a spec with "
                                     f"devices_per_node names its inter-node link)")

    def matrix_flops_for(self, element: str) -> float:
        """Peak for a matmul/convolution on `element`: its entry, else f32's, else the slowest
        entry (an unknown type must not look faster than a known one)."""
        if element in self.flops_per_s:
            return self.flops_per_s[element]
        if "f32" in self.flops_per_s:
            return self.flops_per_s["f32"]
        return min(self.flops_per_s.values())

    def vector_flops_for(self, element: str) -> float:
        return self.vector_flops_per_s or self.matrix_flops_for(element)

    def matmul_seconds(self, flops: float, element: str) -> float:
        """One matmul/convolution of `flops` on `element`: the achievable rate reached by a
        GEMM of this size, `rate * f / (f + half)`, i.e. `(f + half) / rate`."""
        if flops <= 0:
            return 0.0
        rate = self.matrix_flops_for(element) * self.matrix_efficiency
        return (flops + self.matrix_half_flops) / rate

    def memory_seconds(self, nbytes: float) -> float:
        """Reading and writing `nbytes` at the achievable memory bandwidth (the cache's
        where they fit in it)."""
        if self.cache_bandwidth_bytes_per_s and nbytes <= self.cache_bytes:
            return nbytes / self.cache_bandwidth_bytes_per_s
        return nbytes / (self.memory_bandwidth_bytes_per_s * self.memory_efficiency)

    def link_for_axes(self, axes, mesh: Mesh | None = None) -> LinkClass:
        """The link a collective over `axes` is limited by: the slowest of the axes' links (a
        sub-axis, `model:(1)4`, runs on its parent's link). With a `mesh` and a cluster
        (`devices_per_node`), the axes not in `axis_links` run on the links their device
        groups span (`node_link`); otherwise on `axis_links` or `default_link`."""
        axes = tuple(axes)
        clustered = mesh is not None and self.devices_per_node is not None
        named = {self.axis_links[parent_of(a)] for a in axes if parent_of(a) in self.axis_links}
        rest = tuple(a for a in axes if parent_of(a) not in self.axis_links)
        links = [self.links[n] for n in sorted(named)]
        if rest and clustered:
            links.append(self.node_link(rest, mesh))
        elif rest or not links:
            links.append(self.links[self.default_link])
        return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))

    def node_link(self, axes: tuple[str, ...], mesh: Mesh) -> LinkClass:
        """The link of a collective over `axes` on this spec's cluster: the intra-node link
        when every device group stays within a node; else the inter-node link, at g times its
        per-device bandwidth for groups with g members in each node (their g NICs; at most the
        intra-node bandwidth), at the slower of the two latencies."""
        intra = self.links[self.intra_node_link or self.default_link]
        g = members_per_node(mesh, axes, self.devices_per_node or mesh.size)
        if not g:
            return intra
        inter = self.links[self.inter_node_link]
        return LinkClass(inter.name if g == 1 else f"{inter.name} x{g}",
                         min(intra.bandwidth_bytes_per_s, g * inter.bandwidth_bytes_per_s),
                         max(intra.latency_s, inter.latency_s),
                         max(intra.overhead_s, inter.overhead_s))

    def wait_fraction(self, group_size: int) -> float:
        """`rendezvous_wait` for a collective over `group_size` devices (0 below the
        smallest group listed)."""
        listed = [g for g in self.rendezvous_wait if g <= group_size]
        return self.rendezvous_wait[max(listed)] if listed else 0.0

    def with_axis_links(self, axis_links: dict[str, str]) -> HardwareSpec:
        """A copy mapping mesh axes to link classes, e.g. `a100.with_axis_links({"hosts":
        "network"})` when the "hosts" axis crosses machines."""
        return dataclasses.replace(self, axis_links={**self.axis_links, **axis_links})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareSpec:
        """Build from `to_dict()` output; extra keys (raw measurements) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["links"] = {k: v if isinstance(v, LinkClass) else LinkClass(**{"name": k, **v})
                           for k, v in data["links"].items()}
        kwargs["flops_per_s"] = {k: float(v) for k, v in data["flops_per_s"].items()}
        kwargs["memory_bytes"] = int(data["memory_bytes"])
        kwargs["aliases"] = tuple(data.get("aliases", ()))
        kwargs["combined_collectives"] = tuple(data.get("combined_collectives", ()))
        # JSON keys are strings: group sizes back to ints
        kwargs["rendezvous_wait"] = {int(g): float(f)
                                     for g, f in data.get("rendezvous_wait", {}).items()}
        host = data.get("host_link")
        kwargs["host_link"] = host if host is None or isinstance(host, LinkClass) else \
            LinkClass(**host)
        return cls(**kwargs)


@functools.lru_cache(maxsize=4096)
def members_per_node(mesh: Mesh, axes: tuple[str, ...], devices_per_node: int) -> int:
    """0 when every device group of a collective over `axes` stays within one node (replica r
    on node r // devices_per_node); else the fewest members any group has in one of the
    nodes it spans (the NICs its ring can use there)."""
    crossing, fewest = False, mesh.size
    for group in mesh.groups(axes):
        per_node = Counter(r // devices_per_node for r in group)
        crossing = crossing or len(per_node) > 1
        fewest = min(fewest, *per_node.values())
    return fewest if crossing else 0


@dataclass(frozen=True)
class CollectiveCost:
    """One collective of the program. `bytes` is the buffer size the ring formula uses (the full
    array for all_gather/reduce_scatter), `sent_bytes` what each device sends; `count` is how many
    times it runs (a while body's trip count)."""

    kind: str
    axes: tuple[str, ...]
    group_size: int
    link: str
    bytes: int
    sent_bytes: float
    time_s: float
    count: int = 1


@dataclass(frozen=True, eq=False)
class TimelineEvent:
    """One kernel of a simulated timeline, for traces and per-collective diagnostics: `ops`
    are the device-local ops it runs (its root; every member of a combined collective),
    `collectives` their costs, one per op (collectives only). A loop (or branch) is an event
    on the compute stream spanning the events of its body, once per iteration, that follow it.
    `inputs`/`outputs` are the values it reads and defines (for live bytes)."""

    name: str
    stream: str  # "compute" or "comm"
    start_s: float
    duration_s: float
    ops: tuple = ()
    collectives: tuple[CollectiveCost, ...] = ()
    inputs: tuple = ()
    outputs: tuple = ()
    # The loops around an event in a loop body, outermost first: (trip count, seconds per
    # iteration). The event stands for its first iteration; `executions()` gives them all.
    # (Listing every iteration made a 1536-step decode loop's report take 30 s.)
    loops: tuple[tuple[int, float], ...] = ()

    @property
    def count(self) -> int:
        """How many times the event runs per step."""
        n = 1
        for trips, _ in self.loops:
            n *= trips
        return n

    def executions(self) -> Iterator[TimelineEvent]:
        """The event once per iteration of the loops around it, at its own start."""
        offsets = [0.0]
        for trips, period in self.loops:
            offsets = [o + i * period for o in offsets for i in range(trips)]
        for o in offsets:
            yield dataclasses.replace(self, start_s=self.start_s + o, loops=()) if o else self


def expand_timeline(events: Iterable[TimelineEvent]) -> list[TimelineEvent]:
    """Every execution of every event (for a trace file), in start order within a stream."""
    out = [x for e in events for x in e.executions()]
    out.sort(key=lambda e: e.start_s)
    return out


@dataclass
class SimulationResult:
    """Estimated cost of one device-local program on one device of the mesh.

    `peak_memory_bytes` = `argument_bytes` + `output_bytes` - `alias_bytes` + `temp_peak_bytes`,
    the same decomposition XLA's memory analysis reports, so the two can be compared directly.
    """

    runtime_s: float
    compute_s: float
    communication_s: float
    flops: float
    bytes_accessed: float
    peak_memory_bytes: int
    per_collective: list[CollectiveCost] = field(default_factory=list)
    transcendentals: float = 0.0
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_peak_bytes: int = 0
    communication_bytes: float = 0.0
    kernels: int = 0
    unknown_ops: list[str] = field(default_factory=list)
    unknown_trip_counts: int = 0
    hardware: str = ""
    simulator: str = ""
    overlap: bool = False
    memory_limit_bytes: int = 0
    # Every kernel with its start, when the simulator was asked for it (`timeline=True`).
    timeline: list[TimelineEvent] = field(default_factory=list)

    @property
    def collective_counts(self) -> dict[str, int]:
        """Executions per collective kind (while bodies counted by their trip count)."""
        counts: dict[str, int] = {}
        for c in self.per_collective:
            counts[c.kind] = counts.get(c.kind, 0) + c.count
        return counts

    @property
    def fits_in_memory(self) -> bool:
        return self.memory_limit_bytes <= 0 or self.peak_memory_bytes <= self.memory_limit_bytes

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data (the timeline, which holds IR, is left out)."""
        data = dataclasses.asdict(dataclasses.replace(self, timeline=[]))
        del data["timeline"]
        data["collective_counts"] = self.collective_counts
        data["fits_in_memory"] = self.fits_in_memory
        return data


class Simulator(Protocol):
    """What a `partir_add_simulators` plugin contributes."""

    def __call__(self, func: Any, mesh: Mesh, hardware: HardwareSpec,
                 **options: Any) -> SimulationResult: ...

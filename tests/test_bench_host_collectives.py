"""benchmarks/host_collectives.py: what its pattern table says the host-cpu spec charges (each
psum its ring cost, and its own group's rendezvous wait on the stretch right before it only),
and one short run of the patterns writing its section."""

import benchmark_module
import pytest

from partir_plugin.cost import HardwareSpec, LinkClass

host_collectives = benchmark_module.load("host_collectives")

LINK = LinkClass("host", 1e9, 5e-6, overhead_s=40e-6)
SPEC = HardwareSpec(name="shared-cores", flops_per_s={"f32": 1e10}, memory_bytes=2**30,
                    memory_bandwidth_bytes_per_s=1e9, links={"host": LINK},
                    default_link="host", rendezvous_wait={2: 0.02, 4: 0.05, 8: 0.15})


def _all_reduce(g: int) -> float:
    return LINK.overhead_s + 2 * (g - 1) * LINK.latency_s + 2 * (g - 1) / g * 4096 / 1e9


def test_charge_is_the_link_and_the_own_groups_wait_on_the_stretch_before():
    s = 2e-3
    assert host_collectives.charge("S E", s, SPEC) == pytest.approx(_all_reduce(4) + 0.05 * s)
    assert host_collectives.charge("S A", s, SPEC) == pytest.approx(_all_reduce(8) + 0.15 * s)
    # a psum right after another waits for nothing: the stretch went to the first
    assert host_collectives.charge("S E D", s, SPEC) == pytest.approx(
        _all_reduce(4) + 0.05 * s + _all_reduce(2))
    assert host_collectives.charge("S E D D", s, SPEC) == pytest.approx(
        _all_reduce(4) + 0.05 * s + 2 * _all_reduce(2))
    # a stretch between them: each its own group's wait
    assert host_collectives.charge("S A S D", s, SPEC) == pytest.approx(
        _all_reduce(8) + 0.15 * s + _all_reduce(2) + 0.02 * s)
    # a spec without waits (an accelerator) charges the links alone
    plain = HardwareSpec(**{**SPEC.__dict__, "rendezvous_wait": {}})
    assert host_collectives.charge("S E S D", s, plain) == pytest.approx(
        _all_reduce(4) + _all_reduce(2))


@pytest.mark.slow
@pytest.mark.exhaustive
def test_patterns_run_and_write_their_section(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    assert host_collectives.main(["--rounds", "1", "--block", "1", "--kernels", "4",
                                  "--families", "--output", str(out)]) == 0
    text = out.read_text()
    assert host_collectives.HEADING in text
    rows = [line for line in text.splitlines() if line.startswith("| S ")]
    assert [r.split("|")[1].strip() for r in rows] == host_collectives.PATTERNS

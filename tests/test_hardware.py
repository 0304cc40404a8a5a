"""Hardware specs: built-ins, lookup through plugins, the calibrated host spec."""

from __future__ import annotations

import argparse
import json
import os

import jax
import pytest
from partir_hardware import calibrate
from partir_hardware.host import CALIBRATION_ENV, load_host_spec

from partir_plugin.cost import HardwareSpec, LinkClass
from partir_plugin.plugin import manager

BUILTIN = {"tpu-v3", "a100-40gb", "a100-80gb", "h100-sxm", "h100-dgx", "h200-sxm", "host-cpu"}


def test_plugin_lookup_finds_every_builtin_spec():
    specs = manager.hardware_specs()
    assert BUILTIN <= set(specs)
    a100 = specs["a100-40gb"]
    assert a100.matrix_flops_for("f32") == 156e12 and a100.matrix_flops_for("bf16") == 312e12
    assert a100.memory_bandwidth_bytes_per_s == 1555e9
    tpu = specs["tpu-v3"]
    assert tpu.memory_bytes == 16 * 2**30 and tpu.matrix_flops_for("bf16") == 123e12
    assert tpu.links["ici"].bandwidth_bytes_per_s == 70e9
    h100, h200 = specs["h100-sxm"], specs["h200-sxm"]
    assert h200.memory_bandwidth_bytes_per_s > h100.memory_bandwidth_bytes_per_s


def test_spec_links_per_axis_and_validation():
    a100 = manager.hardware_specs()["a100-40gb"].with_axis_links({"hosts": "network"})
    assert a100.link_for_axes(["model"]).name == "nvlink"
    assert a100.link_for_axes(["hosts", "model"]).name == "network"
    assert a100.matrix_flops_for("f8E4M3FN") == 156e12  # unknown type: the f32 figure
    with pytest.raises(ValueError, match="default_link 'ib'"):
        HardwareSpec("x", {"f32": 1.0}, 1, 1.0, {"nv": LinkClass("nv", 1.0, 0.0)}, "ib")
    with pytest.raises(ValueError, match="axis 'B' maps to unknown link"):
        a100.with_axis_links({"B": "carrier-pigeon"})
    assert HardwareSpec.from_dict(json.loads(json.dumps(a100.to_dict()))) == a100


def test_host_spec_defaults_without_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "missing.json"))
    spec = manager.hardware_specs()["host-cpu"]
    assert spec.name == "host-cpu" and "uncalibrated" in spec.notes
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring calibration file"):
        assert "uncalibrated" in load_host_spec(tmp_path / "bad.json").notes


@pytest.mark.slow  # times kernels
def test_calibrate_writes_a_spec_the_plugin_loads(tmp_path, monkeypatch):
    jax.devices()  # the test process keeps its devices; calibrate measures beside it
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    out = tmp_path / "host.json"
    parser = argparse.ArgumentParser()
    calibrate.add_arguments(parser)
    args = parser.parse_args(["--budget", "1", "--devices", "4", "--output", str(out)])
    assert calibrate.run(args) == 0
    data = json.loads(out.read_text())
    assert data["measurements"]["devices"] == 4
    assert data["flops_per_s"]["f32"] > 0 and data["memory_bandwidth_bytes_per_s"] > 0
    host = data["links"]["host"]
    assert host["bandwidth_bytes_per_s"] > 0 and host["latency_s"] > 0
    assert host["overhead_s"] >= 0  # per collective: groups of two and of four measured
    assert data["measurements"]["load_average"] >= 0 and data["measurements"]["cores"] >= 1
    # The last-level cache's share per device, where this host says how large it is; a cache
    # that streams no faster than memory is left out.
    if data["cache_bytes"]:
        assert data["cache_bandwidth_bytes_per_s"] > data["memory_bandwidth_bytes_per_s"]
        assert data["cache_bytes"] == calibrate.last_level_cache_bytes() // 4
    else:
        assert data["cache_bandwidth_bytes_per_s"] is None
    # Rendezvous waits where the 4 devices outnumber the cores (groups of 2 and 4), none
    # where each has a core of its own; group sizes come back as ints.
    shared = (os.cpu_count() or 4) < 4
    assert set(data["rendezvous_wait"]) == ({"2", "4"} if shared else set())
    assert all(f >= 0 for f in data["rendezvous_wait"].values())
    if shared:
        raw = data["measurements"]["rendezvous"]
        assert raw["stretch_s"] > 0 and raw["psum_4_s"] > 0
    monkeypatch.setenv(CALIBRATION_ENV, str(out))
    spec = manager.hardware_specs()["host-cpu"]
    assert spec.flops_per_s["f32"] == pytest.approx(data["flops_per_s"]["f32"])
    assert "measured" in spec.notes
    assert spec.rendezvous_wait == {int(g): f for g, f in data["rendezvous_wait"].items()}


def test_collective_overhead_and_latency_fit():
    """All-reduces over two devices (2 ring steps) and over eight (14): a fixed 50 us per
    collective and 10 us per step are recovered; a noisy pair never makes either negative."""
    overhead, latency = calibrate.fit_overhead_and_latency(50e-6 + 2 * 10e-6,
                                                           50e-6 + 14 * 10e-6, 8)
    assert overhead == pytest.approx(50e-6) and latency == pytest.approx(10e-6)
    overhead, latency = calibrate.fit_overhead_and_latency(30e-6, 20e-6, 8)
    assert overhead >= 0 and latency > 0


def test_a_calibration_on_a_busy_host_is_warned_about():
    assert calibrate.busy_host(0.5, 2) is None and calibrate.busy_host(3.0, None) is None
    warning = calibrate.busy_host(9.3, 2)
    assert warning and "busy" in warning and "9.3" in warning and "partir calibrate" in warning


def test_gemm_fit_recovers_rate_and_half_size():
    rate, half = 300e12, 2e9
    flops = [2.0 * n**3 for n in (256, 512, 1024, 2048, 4096)]
    r, h = calibrate.fit_gemm(flops, [(f + half) / rate for f in flops])
    assert r == pytest.approx(rate, rel=1e-6) and h == pytest.approx(half, rel=1e-4)


@pytest.mark.slow  # times kernels
def test_accelerator_calibration_measures_the_cost_structure():
    """The --accelerator path run on a CPU device (no GPU here): a calibrated copy of the
    datasheet spec with measured rates, bandwidth and overhead, which the simulator takes."""
    assert calibrate.base_spec_for("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert calibrate.base_spec_for("TPU v3").name == "tpu-v3"
    with pytest.raises(SystemExit, match="--base"):
        calibrate.base_spec_for("Some New GPU")
    base = calibrate.base_spec_for("anything", "h100-sxm")
    data = calibrate.measure_accelerator(1.0, jax.devices()[0], base)
    spec = HardwareSpec.from_dict(data)
    assert spec.name == "h100-sxm-calibrated" and spec.links == base.links
    assert 0 < spec.flops_per_s["f32"] < base.flops_per_s["f32"]
    assert spec.memory_bandwidth_bytes_per_s > 0 and spec.kernel_overhead_s >= 0
    assert spec.matrix_efficiency == 1.0 and spec.matrix_half_flops >= 0
    assert set(data["measurements"]["gemm_seconds"]) == {"f32", "bf16"}
    assert spec.matmul_seconds(2e9, "f32") > 2e9 / spec.flops_per_s["f32"] * 0.999

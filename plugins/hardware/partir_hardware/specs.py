"""Datasheet hardware specs (per device; per core on TPU).

Matrix peaks are the dense tensor-core figures (sparsity figures halved away); memory capacities
are read as GiB because HBM stacks are binary-sized. NVIDIA quotes NVLink bandwidth as the
bidirectional total; a ring sends in one direction, so links carry half of it. Latencies are not
on datasheets: the values below (about 1 us per NVLink/ICI ring step, 5 us across InfiniBand) are
order-of-magnitude assumptions, visible only for small collectives.

GPU cost structure (`kernel_overhead_s`, `matrix_efficiency`, `matrix_half_flops`,
`memory_efficiency`): datasheet peaks alone made every H100 step estimate optimistic, by 8x on
small steps. The four constants below were fitted on 2026-11-23 to jax.jit step times of the
repository's transformer train step on one H100 SXM (jax 0.11.2, CUDA 13, f32 with jax's
default TF32 matmuls; four configs from 12 GFLOP to 12 TFLOP per step,
`tests/data/h100_transformer_step_times.json`): all four within 2%, and each within 0.95-1.10
when left out of the fit (docs/simulator.md).
`partir calibrate --accelerator` measures them on the present device.
"""

from __future__ import annotations

import dataclasses

from partir_plugin.extend import HardwareSpec, LinkClass

GiB = 2**30

# Fitted on one H100 SXM, 2026-11-23, jax 0.11.2 (see the module docstring): the time XLA's GPU
# runtime spends per kernel (launch, thunk dispatch, the gap before the next), the fraction of
# the dense TF32/BF16 peak large GEMMs reach, the GEMM size at half that rate (the fit is
# flat in it between 0 and 1e9 flops: a mid value), and the achievable HBM bandwidth fraction.
H100_FIT = {"kernel_overhead_s": 5.5e-6, "matrix_efficiency": 0.725,
            "matrix_half_flops": 2e8, "memory_efficiency": 0.75}

# XLA:GPU's collective combiners (gpu_compiler.cc: AllReduceCombiner, AllGatherCombiner,
# ReduceScatterCombiner) with their default threshold, 30 MiB
# (`--xla_gpu_all_reduce_combine_threshold_bytes` and its siblings).
XLA_GPU_COMBINERS = {"combined_collectives": ("all_reduce", "all_gather", "reduce_scatter"),
                     "combine_threshold_bytes": 30 * 2**20}

TPU_V3 = HardwareSpec(
    name="tpu-v3",
    platform="tpu",
    aliases=("tpuv3", "tpu_v3", "v3"),
    # PartIR paper appendix A.2: per tensor core 16 GiB HBM2, 61.5 TFLOP/s f32, 123 bf16/f16.
    flops_per_s={"f32": 61.5e12, "bf16": 123e12, "f16": 123e12},
    memory_bytes=16 * GiB,
    # Jouppi et al. 2020 (CACM, "A domain-specific supercomputer for training DNNs"): 900 GB/s
    # HBM per chip, shared by its two cores.
    memory_bandwidth_bytes_per_s=450e9,
    # A.2: four 70 GB/s ICI links per chip; a ring along one torus axis sends over one of them.
    links={"ici": LinkClass("ici", 70e9, 1e-6)},
    default_link="ici",
    # XLA:TPU combines independent all-reduces too; its threshold is not public: assumed
    # to be XLA:GPU's.
    combined_collectives=("all_reduce",),
    combine_threshold_bytes=30 * 2**20,
    notes="PartIR appendix A.2; HBM bandwidth from Jouppi et al. 2020; per core",
)

A100_40GB = HardwareSpec(
    name="a100-40gb",
    platform="cuda",
    aliases=("a100", "a100-40g", "a100_40gb"),
    # NVIDIA A100 datasheet (SXM): TF32 156, BF16/FP16 312, FP64 tensor 19.5 TFLOP/s,
    # INT8 624 TOPS; FP32 (non-tensor) 19.5 TFLOP/s for elementwise work.
    flops_per_s={"f32": 156e12, "bf16": 312e12, "f16": 312e12, "f64": 19.5e12, "i8": 624e12},
    vector_flops_per_s=19.5e12,
    memory_bytes=40 * GiB,
    memory_bandwidth_bytes_per_s=1555e9,  # HBM2, 1,555 GB/s
    # NVLink 600 GB/s bidirectional -> 300 GB/s each way; DGX A100: one 200 Gb/s HDR
    # InfiniBand port per GPU -> 25 GB/s across hosts.
    links={"nvlink": LinkClass("nvlink", 300e9, 1e-6),
           "network": LinkClass("network", 25e9, 5e-6)},
    default_link="nvlink",
    # A100 datasheet: PCIe Gen4, 64 GB/s bidirectional (x16) -> 32 GB/s each way to host
    # memory (RM's offload); latency assumed, as the NVLink one.
    host_link=LinkClass("pcie", 32e9, 1e-6),
    # Not measured on an A100: the H100 fit's structure (same CUDA runtime, same kind of
    # tensor-core GEMMs and HBM), an assumption until `partir calibrate` runs on one.
    **H100_FIT,
    **XLA_GPU_COMBINERS,
    notes="NVIDIA A100 40GB SXM datasheet; PartIR appendix A.2; GPU cost structure assumed "
          "from the H100 fit",
)

H100_SXM = HardwareSpec(
    name="h100-sxm",
    platform="cuda",
    aliases=("h100", "h100-80gb", "h100_sxm"),
    # NVIDIA H100 datasheet (SXM), dense: TF32 494.5, BF16/FP16 989.5, FP8 1979, FP64 tensor 67
    # TFLOP/s, INT8 1979 TOPS; FP32 (non-tensor) 67 TFLOP/s.
    flops_per_s={"f32": 494.5e12, "bf16": 989.5e12, "f16": 989.5e12, "f8E4M3FN": 1979e12,
                 "f8E5M2": 1979e12, "f64": 67e12, "i8": 1979e12},
    vector_flops_per_s=67e12,
    memory_bytes=80 * GiB,
    memory_bandwidth_bytes_per_s=3.35e12,  # HBM3, 3.35 TB/s
    # NVLink 900 GB/s bidirectional -> 450 GB/s each way; DGX H100: one 400 Gb/s NDR
    # InfiniBand port per GPU -> 50 GB/s across hosts.
    links={"nvlink": LinkClass("nvlink", 450e9, 1e-6),
           "network": LinkClass("network", 50e9, 5e-6)},
    default_link="nvlink",
    # H100 SXM datasheet: PCIe Gen5, 128 GB/s bidirectional (x16) -> 64 GB/s each way to host
    # memory (RM's offload; the H200 has the same); latency assumed.
    host_link=LinkClass("pcie", 64e9, 1e-6),
    **H100_FIT,
    **XLA_GPU_COMBINERS,
    notes="NVIDIA H100 SXM5 80GB datasheet; GPU cost structure fitted to measured step times "
          "(2026-11-23, jax 0.11.2)",
)

# NVIDIA H200 datasheet (SXM): the H100's compute, NVLink and CUDA runtime (so its fit) with
# 141 GB HBM3e at 4.8 TB/s; HGX H200 pairs each GPU with a 400 Gb/s NIC, as HGX H100.
H200_SXM = dataclasses.replace(
    H100_SXM,
    name="h200-sxm",
    aliases=("h200", "h200-141gb", "h200_sxm"),
    memory_bytes=141 * GiB,
    memory_bandwidth_bytes_per_s=4.8e12,
    notes="NVIDIA H200 SXM 141GB datasheet; GPU cost structure from the H100 fit",
)

# Whole nodes (`devices_per_node`, the intra- and inter-node links: cost.HardwareSpec): a
# collective's link comes from the mesh's device order, so tensor parallelism across nodes
# costs what it costs (docs/simulator.md, "Clusters").


def dgx_node(gpu: HardwareSpec, nvlink_bytes_per_s: float, nic_bytes_per_s: float,
             **changes) -> HardwareSpec:
    """`gpu` in a DGX node of 8: NVSwitch NVLink inside (`nvlink_bytes_per_s` each way, 1 us
    a ring step), one InfiniBand NIC per GPU across nodes (`nic_bytes_per_s` each way, 5 us),
    as in the module docstring."""
    return dataclasses.replace(
        gpu,
        links={"nvlink": LinkClass("nvlink", nvlink_bytes_per_s, 1e-6),
               "infiniband": LinkClass("infiniband", nic_bytes_per_s, 5e-6)},
        default_link="nvlink", devices_per_node=8, intra_node_link="nvlink",
        inter_node_link="infiniband", **changes)


# NVIDIA DGX A100 datasheet (80GB): 8 A100 SXM4 80GB, NVSwitch with 600 GB/s NVLink per GPU
# (bidirectional -> 300 GB/s each way), 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand
# compute adapters (one per GPU: 25 GB/s each way per GPU). NVIDIA A100 datasheet (SXM 80GB):
# the 40GB part's tensor-core peaks with HBM2e at 2,039 GB/s.
A100_80GB = dgx_node(
    A100_40GB, 300e9, 25e9,
    name="a100-80gb",
    aliases=("a100-80g", "a100_80gb", "dgx-a100"),
    memory_bytes=80 * GiB,
    memory_bandwidth_bytes_per_s=2039e9,
    notes="NVIDIA DGX A100 (80GB) and A100 SXM4 80GB datasheets; GPU cost structure assumed "
          "from the H100 fit",
)

# NVIDIA DGX H100 datasheet: 8 H100 SXM5 80GB, NVSwitch with 900 GB/s NVLink per GPU
# (-> 450 GB/s each way), 8 single-port ConnectX-7 400 Gb/s NDR InfiniBand compute ports
# (one per GPU: 50 GB/s each way per GPU); the GPU is h100-sxm's (its fit included).
H100_DGX = dgx_node(
    H100_SXM, 450e9, 50e9,
    name="h100-dgx",
    aliases=("dgx-h100", "h100_dgx"),
    notes="NVIDIA DGX H100 and H100 SXM5 80GB datasheets; GPU cost structure fitted to "
          "measured step times (2026-11-23, jax 0.11.2)",
)

DATASHEET_SPECS = (TPU_V3, A100_40GB, A100_80GB, H100_SXM, H100_DGX, H200_SXM)

"""Compile device-local StableHLO through PJRT and run it on a mesh's devices (DESIGN §2.3)."""

from .executable import DeviceLocalExecutable, jax_mesh_for

__all__ = ["DeviceLocalExecutable", "jax_mesh_for"]

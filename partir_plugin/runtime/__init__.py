"""Run device-local StableHLO as a jax function on a mesh's devices (DESIGN §2.3)."""

from .executable import DeviceLocalFunction, jax_mesh_for

__all__ = ["DeviceLocalFunction", "jax_mesh_for"]

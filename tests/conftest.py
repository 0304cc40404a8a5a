"""Every test runs on 8 virtual CPU devices, set before jax is imported.

One run of the suite shares jax's persistent compilation cache (a fresh folder per run, removed
at its end): many tests compile the same unpartitioned `jax.jit` reference or the same
partitioned step, and on 2 cores compiling is most of the suite's time. Each xdist worker
inherits the controller's folder through the environment. `PARTIR_TEST_COMPILE_CACHE=0`
turns it off (every compile fresh, as before).
"""

import atexit
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

if (os.environ.get("PARTIR_TEST_COMPILE_CACHE", "1") != "0"
        and "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    _cache = tempfile.mkdtemp(prefix="partir-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    atexit.register(shutil.rmtree, _cache, True)

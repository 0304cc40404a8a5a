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

# XLA:CPU compiles at LLVM -O0 in the tests (`PARTIR_TEST_XLA_O0=0`: its default): compiling
# is most of the suite's time on 2 cores, and -O0 takes 45% off it (a PP+BP+MP test: 47 -> 26
# CPU s) with the same HLO (fusion, buffer assignment, metadata) and the same float semantics
# (no fast math either way); the tests' programs are small, so running them slower costs
# little. Benchmarks measure with XLA's default.
_flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
if (os.environ.get("PARTIR_TEST_XLA_O0", "1") != "0"
        and "xla_backend_optimization_level" not in _flags):
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The tests see host-cpu's uncalibrated defaults whether or not this machine ran `partir
# calibrate` (its file in ~/.cache would change every host-cpu estimate, and the planner's
# choices with them); test_hardware points the variable at its own files.
os.environ.setdefault("PARTIR_CALIBRATION_FILE",
                      os.path.join(tempfile.gettempdir(), "partir-tests-no-calibration.json"))

if (os.environ.get("PARTIR_TEST_COMPILE_CACHE", "1") != "0"
        and "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    _cache = tempfile.mkdtemp(prefix="partir-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    atexit.register(shutil.rmtree, _cache, True)


# The files that take longest, first: `--dist loadfile` hands files to the two workers in the
# order they are collected, and a long file collected last runs alone at the end (it left
# one worker idle for two minutes). Longest first, the short files fill in around them.
_LONGEST_FIRST = ("test_tmr_verifier_models.py", "test_paper_models.py", "test_pipeline.py",
                  "test_pp_recipes.py", "test_tmr_verifier.py", "test_docs.py",
                  "test_bench_pipeline.py", "test_rematerialization.py", "test_halo.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept

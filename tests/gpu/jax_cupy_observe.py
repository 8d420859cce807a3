"""JAX and CuPy doing a little work, to be observed by the shim (VRAMSCOPE_MODE=passthrough).

Prints one JSON line per framework with a result checksum; the shim's summary on stderr shows
what it recorded (VMM mappings for JAX, cuMemAlloc for CuPy).
"""
import json
import os
import sys

which = sys.argv[1] if len(sys.argv) > 1 else "both"

if which in ("jax", "both"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    x = jnp.arange(1 << 22, dtype=jnp.float32)
    total = 0.0
    for i in range(20):
        y = jnp.sin(x * (i + 1)) @ jnp.ones((1 << 22,), jnp.float32)
        total += float(y)
    print(json.dumps({"framework": "jax", "checksum": round(total, 2),
                      "device": str(jax.devices()[0])}))

if which in ("cupy", "both"):
    import cupy as cp

    total = 0.0
    for i in range(50):
        a = cp.arange((1 << 20) + i * 4096, dtype=cp.float32)
        total += float(cp.sum(cp.sqrt(a)))
    cp.get_default_memory_pool().free_all_blocks()
    print(json.dumps({"framework": "cupy", "checksum": round(total, 1)}))

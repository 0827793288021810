"""Where the code runs: the device set-up, and on the CPU what lets Megatron-Core run there.

- ``device_setup.py``: the device, the dtype, the process-group backend, the layer specs, the
  process group and Megatron's parallel state (``init_distributed``), and when the CPU's patches
  are installed (``install_cpu_shims``). On a machine with CUDA nothing in Megatron-Core changes.
- ``shims.py``: the compatibility shims 1-8, Megatron-Core's CUDA assumptions redirected to the
  CPU with the gloo backend (and the MoE router without Transformer Engine, CPU or GPU).
- ``cpu_speedups.py``: the CPU speed-ups 9-13, the same step faster, each with its own on/off.
- ``patch.py``: what makes each of them a named unit gated on the versions it was written for
  (megatron-core 0.16.x on Python 3.11 and 0.19.x on 3.12, torch 2.13): where a new version has
  changed what one relies on, it stops with one sentence naming itself instead of patching blind.

``from megatron_rlep import platform`` then ``platform.device()``: every name the rest of the
package, the tools, the benchmarks and the tests use is importable from here.

This package must not import anything from the rest of megatron_rlep: everything else reads only
``device()``, ``compute_dtype()``, ``backend()``, ``layer_spec()`` and ``init_distributed()``
(and, in the actor, the CPU's optimizer helpers).
"""

from megatron_rlep.platform.cpu_speedups import (  # noqa: F401
    _intel_cpu, _onednn, _OneDnnLinear, fused_cpu_adam, onednn_linears_apply)
from megatron_rlep.platform.cpu_speedups import (  # noqa: F401 (as the benchmarks call it)
    linear_products_through_onednn as _linear_products_through_onednn)
from megatron_rlep.platform.device_setup import (  # noqa: F401
    any_rank, backend, compute_dtype, destroy_distributed, device, has_cuda,
    have_transformer_engine, init_distributed, install_cpu_shims, is_rank0, layer_spec,
    reset_model_parallel, transformer_engine_unavailable)
from megatron_rlep.platform.shims import (  # noqa: F401
    clip_factor, clip_grad_norm, cuda_type_names, device_rewrite_paused, grad_norm, scale_grads)

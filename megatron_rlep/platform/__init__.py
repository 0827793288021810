"""Where the code runs: the device set-up, and on the CPU the shims that let Megatron-Core run there.

``from megatron_rlep import platform`` then ``platform.device()``: every name the rest of the
package, the tools, the benchmarks and the tests use is importable from here.
"""

from megatron_rlep.platform.device_setup import (  # noqa: F401
    _intel_cpu, _linear_products_through_onednn, _onednn, _OneDnnLinear, any_rank, backend,
    clip_factor, clip_grad_norm, compute_dtype, cuda_type_names, destroy_distributed, device,
    fused_cpu_adam, grad_norm, has_cuda, have_transformer_engine, init_distributed,
    install_cpu_shims, is_rank0, layer_spec, onednn_linears_apply, reset_model_parallel,
    scale_grads, transformer_engine_unavailable)

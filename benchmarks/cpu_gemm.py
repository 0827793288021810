"""The demo's update's matrix products by MKL (torch's own) against oneDNN, per kind.

    python benchmarks/cpu_gemm.py [--tokens 440] [--rows 288] [--repeats 7]

The products of one update of the demo's job on the built-in model (SmolLM2-135M: hidden 576, Q, K
and V 576 + 2 x 192 outputs, the gated MLP 2 x 1536, vocabulary 49152), ``--tokens``
tokens through a layer (two shared prompts of 76 and 12 answers of 24), ``--rows`` response rows
through the output layer. Per kind: the forward (x W^T), the input gradient (g W) and the weight
gradient (g^T x added into a gradient buffer, as gradient accumulation fusion does: MKL's
``addmm_``, oneDNN's product then an add). Each is timed by both libraries in turn, the median
of ``--repeats``; a layer's four products count once and the output layer's once (a model has
30 layers: the ``per update`` line weights them so). Platform shim 13 takes, per kind, what this
says is faster on the CPUs it runs on. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def products(x, w, g, buffer):
    """{kind: {library: product}} for x [t, in], w [out, in], g [t, out]; oneDNN's is the one
    platform shim 13 calls."""
    from megatron_rlep.platform import _onednn as dnn

    return {"forward": {"mkl": lambda: torch.nn.functional.linear(x, w),
                        "onednn": lambda: dnn(x, w)},
            "input_gradient": {"mkl": lambda: g @ w, "onednn": lambda: dnn(g, w.t())},
            "weight_gradient": {"mkl": lambda: buffer.addmm_(g.t(), x),
                                "onednn": lambda: buffer.add_(dnn(g.t(), x.t()))}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=440)
    parser.add_argument("--rows", type=int, default=288)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    shapes = {"qkv": (args.tokens, 576, 960), "proj": (args.tokens, 576, 576),
              "fc1": (args.tokens, 576, 3072), "fc2": (args.tokens, 1536, 576),
              "output_layer": (args.rows, 576, 49152)}
    result, update = {}, {}
    for name, (t, k, n) in shapes.items():
        x, w, g = torch.randn(t, k), torch.randn(n, k), torch.randn(t, n)
        times = {kind: {lib: median_ms(run, args.repeats) for lib, run in libs.items()}
                 for kind, libs in products(x, w, g, torch.zeros(n, k)).items()}
        result[name] = {kind: {lib: round(ms, 2) for lib, ms in by_lib.items()}
                        for kind, by_lib in times.items()}
        weight = 1 if name == "output_layer" else args.layers
        for kind, by_lib in times.items():
            for lib, ms in by_lib.items():
                update.setdefault(kind, {}).setdefault(lib, 0.0)
                update[kind][lib] += weight * ms
    result["per_update_ms"] = {kind: {lib: round(ms, 1) for lib, ms in by_lib.items()}
                               for kind, by_lib in update.items()}
    result["mkl_over_onednn"] = {kind: round(by_lib["mkl"] / by_lib["onednn"], 3)
                                 for kind, by_lib in update.items()}
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Test instrumentation, put first on PYTHONPATH by scripts/gpu_devices.sh (and through it by
tests/test_roles.py) where RANK_DEVICE_RECORD names a file: which GPU each rank of a job takes
(a process with RANK set; its launcher is left alone).

A process ends, with exit status 0, at the first call that takes a device (a job cannot run on a
fake GPU, and the question is answered): ``torch.cuda.set_device(n)`` takes device n; anything
else that starts torch's CUDA state (a tensor on a GPU, ``current_device()``,
``mem_get_info()``) takes the current one, 0. It first appends a JSON line to the file: the RANK
and LOCAL_RANK its launcher gave it, the device, and what CUDA saw.

On a host with CUDA the device is named by its UUID (two processes with one UUID: one GPU).
FAKE_CUDA_DEVICES=N fakes CUDA on a node of N devices, as the real one behaves where a rank's
device is chosen:

* CUDA starts at the first call that would start it (cudaGetDeviceCount behind
  ``torch.cuda.is_available()``, torch's lazy init, cudaSetDevice) and reads
  CUDA_VISIBLE_DEVICES then, once (unset: all N): a later change changes nothing, and a device
  ordinal indexes that list. The start is written down too, with the list;
* NVML (``torch.cuda.device_count()`` before torch's lazy init, ``torch.cuda.is_available()``
  under PYTORCH_NVML_BASED_CUDA_CHECK=1) counts the visible devices and starts nothing;
* the node has /dev/nvidiactl.
"""

import json
import os
import sys

RECORD = os.environ.get("RANK_DEVICE_RECORD")
LAUNCHED = {"rank": os.environ.get("RANK"), "local_rank": os.environ.get("LOCAL_RANK")}


def write(**fields) -> None:
    with open(RECORD, "a") as out:  # one short append per line: the ranks share the file
        out.write(json.dumps({**LAUNCHED, "pid": os.getpid(), **fields}) + "\n")


def end() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def visible(node: int) -> list[int]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: the ordinals up to the first that is not one of
    the node's (or repeats); unset, the node's all."""
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    if names is None:
        return list(range(node))
    found = []
    for name in names.split(","):
        if not name.strip().isdigit() or int(name) >= node or int(name) in found:
            break
        found.append(int(name))
    return found


def fake_cuda(node: int) -> None:
    """torch.cuda's calls on the way to a device, as torch answers them on a CUDA build (its
    ``_is_compiled()`` stays False, so torch's own modules keep to their CPU paths)."""
    import torch

    cuda = torch.cuda
    started = []

    def start(by: str) -> list[int]:
        if not started:
            started.append(visible(node))
            write(event="cuda started", by=by, visible=started[0])
        return started[0]

    def take(ordinal: int, by: str) -> None:
        devices = start(by)
        if not 0 <= ordinal < len(devices):
            raise RuntimeError(f"CUDA error: invalid device ordinal {ordinal} (visible: {devices})")
        write(event="device taken", by=by, device=devices[ordinal], visible=devices)
        end()

    def is_available() -> bool:  # cudaGetDeviceCount, unless asked of NVML
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            return cuda.device_count() > 0
        return len(start("cudaGetDeviceCount")) > 0

    cuda.is_available = is_available
    cuda.device_count = lambda: len(visible(node))  # NVML's count, before torch's lazy init
    cuda.set_device = lambda device: take(cuda._get_device_index(device), "cudaSetDevice")
    cuda._lazy_init = lambda: take(0, "torch's lazy CUDA init")
    exists = os.path.exists
    os.path.exists = lambda path: path == "/dev/nvidiactl" or exists(path)


def watch_cuda() -> None:
    import torch

    cuda = torch.cuda
    set_device, lazy_init, taking = cuda.set_device, cuda._lazy_init, []

    def take(by: str) -> None:
        taking.append(by)  # the calls below start nothing more
        ordinal = torch._C._cuda_getDevice()
        write(event="device taken", by=by, device=str(cuda.get_device_properties(ordinal).uuid),
              name=cuda.get_device_name(ordinal), devices_seen=cuda.device_count(),
              cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        end()

    def taking_set_device(device) -> None:
        set_device(device)
        take("torch.cuda.set_device")

    def taking_lazy_init() -> None:
        lazy_init()
        if not taking and cuda.is_initialized():  # not a call from inside the start
            take("torch's lazy CUDA init")

    cuda.set_device, cuda._lazy_init = taking_set_device, taking_lazy_init


if RECORD and LAUNCHED["rank"] is not None:  # a rank, not its launcher
    if os.environ.get("FAKE_CUDA_DEVICES"):
        fake_cuda(int(os.environ["FAKE_CUDA_DEVICES"]))
    else:
        watch_cuda()

"""Test instrumentation for tests/test_storage.py, put on PYTHONPATH by the test: every
``torch.save`` or safetensors ``save_file`` into a path that contains FULL_DISK_AT fails as a
full file system does (ENOSPC), after writing a few bytes, so a checkpoint's or an export's
write is refused part-way."""

import errno
import os

import safetensors.torch
import torch


def refusing(write):
    def wrapped(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and os.environ["FULL_DISK_AT"] in str(f):
            with open(f, "wb") as out:
                out.write(b"PK\x03\x04")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return write(obj, f, *args, **kwargs)

    return wrapped


torch.save = refusing(torch.save)
safetensors.torch.save_file = refusing(safetensors.torch.save_file)

"""How a checkpoint's state becomes bytes: pickle by default, torch or MindSpore when asked.

A serializer writes to and reads from a binary file object; the checkpoint
container around it (header, checksum, atomic rename) is the same for all.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
from typing import IO, Any, Protocol


class Serializer(Protocol):
    name: str

    def dump(self, state: Any, out: IO[bytes]) -> None: ...

    def load(self, src: IO[bytes]) -> Any: ...


class PickleSerializer:
    """pickle protocol 5: numpy arrays are written as raw buffers, without an extra copy."""

    name = "pickle"

    def dump(self, state: Any, out: IO[bytes]) -> None:
        pickle.dump(state, out, protocol=5)

    def load(self, src: IO[bytes]) -> Any:
        return pickle.load(src)


class TorchSerializer:
    """``torch.save`` / ``torch.load`` (tensors, state dicts, optimizers)."""

    name = "torch"

    def dump(self, state: Any, out: IO[bytes]) -> None:
        import torch

        buf = io.BytesIO()  # torch's zip writer wants a seekable file of its own
        torch.save(state, buf)
        out.write(buf.getbuffer())

    def load(self, src: IO[bytes]) -> Any:
        import torch

        buf = io.BytesIO(src.read())
        try:
            return torch.load(buf, weights_only=False)
        except TypeError:  # torch < 1.13 has no weights_only
            buf.seek(0)
            return torch.load(buf)


class MindSporeSerializer:
    """``mindspore.save_checkpoint`` / ``mindspore.load_checkpoint`` (a Cell, a parameter list or dict)."""

    name = "mindspore"

    def dump(self, state: Any, out: IO[bytes]) -> None:
        import mindspore

        with tempfile.TemporaryDirectory(prefix="taskd-ms-") as tmp:
            path = os.path.join(tmp, "state.ckpt")
            mindspore.save_checkpoint(state, path)
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)

    def load(self, src: IO[bytes]) -> Any:
        import mindspore

        with tempfile.TemporaryDirectory(prefix="taskd-ms-") as tmp:
            path = os.path.join(tmp, "state.ckpt")
            with open(path, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
            return mindspore.load_checkpoint(path)


_REGISTRY: dict[str, Serializer] = {}


def register_serializer(serializer: Serializer) -> None:
    """Make ``serializer`` available by its ``name`` (at most 16 ASCII bytes: it is stored in each file)."""
    name = serializer.name
    if not name or len(name.encode("ascii")) > 16:
        raise ValueError(f"serializer name must be 1..16 ASCII characters, got {name!r}")
    _REGISTRY[name] = serializer


def get_serializer(name_or_obj: str | Serializer) -> Serializer:
    """Look a serializer up by name, or register and return a serializer object."""
    if isinstance(name_or_obj, str):
        try:
            return _REGISTRY[name_or_obj]
        except KeyError:
            raise ValueError(f"unknown serializer {name_or_obj!r}; known: {sorted(_REGISTRY)}") from None
    register_serializer(name_or_obj)
    return name_or_obj


for _s in (PickleSerializer(), TorchSerializer(), MindSporeSerializer()):
    register_serializer(_s)

"""Reading torch files that other tools pickled with protocol 4 or 5, without running their code.

PyKEEN saves its training-loop checkpoints with ``pickle.HIGHEST_PROTOCOL`` (5); torch's
``weights_only=True`` unpickler reads protocol 2 opcodes only and refuses them ("Unsupported
operand 149", the FRAME opcode), and ``weights_only=False`` would run whatever the file names.

`load_weights_only` takes the middle way: it rewrites the archive's ``data.pkl`` into
protocol 2 opcodes (`transcode`, a pure rewrite of the opcode stream: nothing in it is
called) and hands the result to ``torch.load(weights_only=True)``. Globals that torch does
not allow (numpy's random state in a PyKEEN checkpoint, say) are loaded as inert
`Opaque` placeholders instead of being imported or called, so the load runs no code
from the file whatever it contains; tensors, dicts, lists, numbers and strings come back as
they were saved.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["Opaque", "UnsafeFileError", "load_weights_only", "transcode"]

STRING_PUSHES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
BYTES_PUSHES = {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}
MEMO_GETS = {"GET", "BINGET", "LONG_BINGET"}
MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


class UnsafeFileError(ValueError):
    """The file is not a torch zip archive, or holds pickle constructs torch's safe loader refuses."""


class Opaque:
    """Stands in for an object of a class the file names but torch does not allow; never calls it.

    ``args`` are the constructor arguments the file gave and ``state`` its pickled state.
    """

    def __new__(cls, *args: Any) -> "Opaque":
        inst = super().__new__(cls)
        inst.args, inst.state = args, None
        return inst

    def __init__(self, *args: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return "Opaque(...)"


def load_weights_only(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` for archives pickled with any protocol.

    The rewritten archive is built in memory, so a file briefly takes twice its size.

    Raises:
        UnsafeFileError: not a torch zip archive, or a construct the safe loader refuses.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            data, names = _transcoded_archive(archive)
    except (zipfile.BadZipFile, ValueError, KeyError, struct.error) as e:
        raise UnsafeFileError(f"not a torch archive that can be read safely ({e})") from None
    # Every global the file names maps to Opaque; torch's own allowlist (tensor rebuilders,
    # storages, OrderedDict) is consulted first, so tensors are rebuilt as usual.
    with torch.serialization.safe_globals([(Opaque, name) for name in sorted(names)]):
        try:
            return torch.load(data, map_location="cpu", weights_only=True)
        except Exception as e:  # torch's refusal, or an Opaque where a container was expected
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise UnsafeFileError(f"refused by torch's weights-only loader ({first})") from None


def _transcoded_archive(archive: zipfile.ZipFile) -> tuple[io.BytesIO, set[str]]:
    """A copy of ``archive`` whose data.pkl is rewritten by `transcode`, and the globals it names."""
    out, names = io.BytesIO(), set()
    pickles = [info for info in archive.infolist() if info.filename.endswith("data.pkl")]
    if len(pickles) != 1:
        raise ValueError(f"expected one data.pkl in the archive, found {len(pickles)}")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as copy:
        for info in archive.infolist():
            raw = archive.read(info)
            if info is pickles[0]:
                raw, names = transcode(raw)
            copy.writestr(info.filename, raw)
    out.seek(0)
    return out, names


@dataclass
class _Rewrite:
    """State of one transcoding pass over an opcode stream."""

    out: io.BytesIO = field(default_factory=io.BytesIO)
    pending: list[str] = field(default_factory=list)  # strings pushed but not yet written
    strings: dict[int, str] = field(default_factory=dict)  # input memo index -> memoised string
    memo: dict[int, int] = field(default_factory=dict)  # input memo index -> output memo index
    count: int = 0  # memo entries the input has made so far (MEMOIZE's implicit index)
    names: set[str] = field(default_factory=set)  # "module.name" of every global

    def flush(self, keep: int = 0) -> None:
        """Write all pending strings but the last ``keep``."""
        while len(self.pending) > keep:
            self.out.write(_unicode(self.pending.pop(0)))


def transcode(data: bytes) -> tuple[bytes, set[str]]:
    """A pickle stream of any protocol -> an equivalent one in protocol 2 opcodes, and its globals.

    Protocol 4/5 opcodes become their protocol 2 forms: FRAME is dropped, short and 8-byte
    strings become BINUNICODE, MEMOIZE becomes LONG_BINPUT, STACK_GLOBAL becomes GLOBAL,
    bytes and bytearrays become ``_codecs.encode(text, "latin1")`` calls as protocol 2 writes
    them. Strings are re-emitted instead of memoised, so that STACK_GLOBAL's two names are
    known here. Other opcodes are copied; torch's loader refuses the ones it does not know.
    """
    ops = list(pickletools.genops(data))
    ends = [pos for _, _, pos in ops[1:]] + [len(data)]
    state = _Rewrite()
    previous_string = False
    for (op, arg, pos), end in zip(ops, ends):
        previous_string = _rewrite(state, op.name, arg, data[pos:end], previous_string)
    state.flush()
    return state.out.getvalue(), state.names


def _rewrite(s: _Rewrite, name: str, arg: Any, raw: bytes, previous_string: bool) -> bool:
    """Rewrite one opcode into ``s``; returns whether it left a string on top of the stack."""
    if name in STRING_PUSHES or (name in MEMO_GETS and arg in s.strings):
        s.pending.append(arg if name in STRING_PUSHES else s.strings[arg])
        return True
    if name == "MEMOIZE" or name in MEMO_PUTS:
        index = s.count if name == "MEMOIZE" else arg
        s.count = max(s.count, index + 1)
        if previous_string:
            s.strings[index] = s.pending[-1]
            return True
        s.flush()
        s.memo[index] = len(s.memo)
        s.out.write(pickle.LONG_BINPUT + struct.pack("<I", s.memo[index]))
        return False
    if name == "STACK_GLOBAL":
        if len(s.pending) < 2:
            raise ValueError("STACK_GLOBAL whose module and name are not plain strings")
        s.flush(keep=2)
        module, qualname = s.pending
        s.pending.clear()
        s.names.add(f"{module}.{qualname}")
        s.out.write(_global(module, qualname))
        return False
    s.flush()
    s.out.write(_rewritten(s, name, arg, raw))
    return False


def _rewritten(s: _Rewrite, name: str, arg: Any, raw: bytes) -> bytes:
    """The protocol 2 bytes of an opcode that touches no pending string."""
    if name == "FRAME":
        return b""
    if name == "PROTO":
        return pickle.PROTO + bytes([2])
    if name in MEMO_GETS:
        return pickle.LONG_BINGET + struct.pack("<I", s.memo[arg])
    if name in BYTES_PUSHES:
        return _bytes(arg)
    if name == "BYTEARRAY8":
        return _global("builtins", "bytearray") + _bytes(bytes(arg)) + pickle.TUPLE1 + pickle.REDUCE
    if name in ("GLOBAL", "INST"):
        s.names.add(arg.replace(" ", "."))
    return raw


def _unicode(text: str) -> bytes:
    encoded = text.encode("utf-8", "surrogatepass")
    return pickle.BINUNICODE + struct.pack("<I", len(encoded)) + encoded


def _global(module: str, qualname: str) -> bytes:
    if "\n" in module or "\n" in qualname:
        raise ValueError("a global name with a line break")
    return pickle.GLOBAL + f"{module}\n{qualname}\n".encode("utf-8")


def _bytes(value: bytes) -> bytes:
    """Protocol 2's spelling of bytes: _codecs.encode(latin-1 text, "latin1")."""
    return _global("_codecs", "encode") + _unicode(value.decode("latin1")) + _unicode("latin1") + pickle.TUPLE2 + pickle.REDUCE

#!/usr/bin/env python3
"""Writes the state_dict of an M3AE checkpoint as safetensors, names unchanged.

    data_prep/m3ae_to_safetensors.py m3ae.ckpt -o m3ae.safetensors

m3ae.ckpt (from the M3AE paper's code, on PyTorch Lightning) is a torch.save
zip: its "state_dict" holds M3AE's tensors, next to "hyper_parameters",
"callbacks" keyed by Lightning classes, "optimizer_states" and more. Only
torch is needed (Debian's python3-torch): the classes it names outside
torch (pytorch_lightning's, M3AE's own) are unpickled as stand-ins, since
nothing but the tensors is kept. With PyTorch 2.6 and later the checkpoint
is loaded weights-only, as torch.load then does by default, so that none of
its code runs: the stand-ins are what is allowed beyond torch's own list.
Before 2.6 (1.13 has no such list) it is unpickled whole, and classes of
modules that are not installed become stand-ins. vqa_train --init-from
reads the output.

The output is the safetensors format (github.com/huggingface/safetensors):
an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}, "__metadata__": {...}}, then every tensor's bytes in order,
little-endian, contiguous. Floating tensors keep their dtype (F32, F16,
BF16); the C++ reader converts to float32.
"""
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import struct
import sys
import types

try:
    import torch
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("m3ae_to_safetensors.py: needs PyTorch (Debian: apt-get install python3-torch; "
             "run it with /usr/bin/python3)")

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


class StandIn:
    """Any class whose module is not installed: accepts whatever state it had."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    def __call__(self, *args, **kwargs):
        return StandIn()


class StandInModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path while the checkpoint loads: a module no other
    finder knows (pytorch_lightning, M3AE's own) becomes an empty package whose
    every attribute is a StandIn subclass of that name. (Passing torch.load a
    pickle_module does not help: torch 1.13 replaces it with pickle.)"""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        classes = {}

        def stand_in(attribute):
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            if attribute not in classes:
                # One class per name, so that stand-ins can be dict keys
                # (Lightning keys its callbacks dict by class).
                classes[attribute] = type(attribute, (StandIn,), {"__module__": spec.name})
            return classes[attribute]

        module.__getattr__ = stand_in
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def torch_at_least(major, minor):
    return tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) >= (major, minor)


def load_weights_only(path):
    """PyTorch 2.6 and later: torch.load(weights_only=True), every global the
    checkpoint names beyond torch's allow list allowed as a StandIn subclass
    of that name (one per name: Lightning keys its callbacks dict by class)."""
    stand_ins = []
    for name in torch.serialization.get_unsafe_globals_in_checkpoint(path):
        module, _, attribute = name.rpartition(".")
        stand_ins.append((type(attribute, (StandIn,), {"__module__": module}), name))
    with torch.serialization.safe_globals(stand_ins):
        return torch.load(path, map_location="cpu", weights_only=True)


def load_whole(path):
    """Before PyTorch 2.6: the whole pickle, with StandInModules last on
    sys.meta_path for the modules that are not installed."""
    finder = StandInModules()
    sys.meta_path.append(finder)
    before = set(sys.modules)
    try:
        return torch.load(path, map_location="cpu")
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if isinstance(sys.modules[name].__spec__, importlib.machinery.ModuleSpec) and \
                    sys.modules[name].__spec__.loader is finder:
                del sys.modules[name]


def load_state_dict(path):
    try:
        checkpoint = load_weights_only(path) if torch_at_least(2, 6) else load_whole(path)
    except Exception as error:  # torch raises many kinds on a bad file
        raise SystemExit(f"m3ae_to_safetensors.py: {path}: torch.load failed: {error}")
    if isinstance(checkpoint, dict) and "state_dict" in checkpoint:
        state = checkpoint["state_dict"]
    elif isinstance(checkpoint, dict) and all(torch.is_tensor(v) for v in checkpoint.values()):
        state = checkpoint  # a bare state_dict
    else:
        raise SystemExit(f"m3ae_to_safetensors.py: {path}: no 'state_dict' in the checkpoint "
                         f"(keys: {sorted(map(str, checkpoint))[:10] if isinstance(checkpoint, dict) else type(checkpoint).__name__})")
    tensors = {}
    for name, value in state.items():
        if not torch.is_tensor(value):
            raise SystemExit(f"m3ae_to_safetensors.py: {path}: state_dict entry '{name}' is a "
                             f"{type(value).__name__}, not a tensor")
        if value.dtype not in DTYPES:
            raise SystemExit(f"m3ae_to_safetensors.py: {path}: tensor '{name}' has dtype "
                             f"{value.dtype}, which safetensors cannot hold here")
        tensors[str(name)] = value.detach().contiguous().cpu()
    return tensors


def write_safetensors(tensors, path, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # data aligned to 8 bytes, as the reference writer does
    temporary = path + ".partial"
    with open(temporary, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for name in names:
            tensor = tensors[name]
            if sys.byteorder != "little":
                raise SystemExit("m3ae_to_safetensors.py: needs a little-endian machine")
            # The tensor's bytes, whatever its dtype.
            out.write(tensor.view(-1).view(torch.uint8).numpy().tobytes()
                      if tensor.numel() else b"")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="M3AE checkpoint (m3ae.ckpt) or a saved state_dict")
    parser.add_argument("-o", "--output", required=True, help="safetensors file to write")
    args = parser.parse_args()
    tensors = load_state_dict(args.checkpoint)
    metadata = {"source": os.path.basename(args.checkpoint), "format": "pt",
                "written_by": "vqa-hpc data_prep/m3ae_to_safetensors.py"}
    try:
        write_safetensors(tensors, args.output, metadata)
    except OSError as error:
        raise SystemExit(f"m3ae_to_safetensors.py: cannot write {args.output}: {error}")
    parameters = sum(t.numel() for t in tensors.values())
    print(f"m3ae_to_safetensors.py: wrote {len(tensors)} tensors ({parameters / 1e6:.2f}M values) "
          f"to {args.output}")


if __name__ == "__main__":
    main()

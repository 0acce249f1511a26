#!/usr/bin/env python3
"""Turns vqa_train --export-m3ae's file into a state_dict for M3AE's own code.

    data_prep/m3ae_from_safetensors.py model.safetensors -o model.ckpt \\
        [--clip-text-from m3ae.ckpt]

The file holds the fine-tuned model under M3AE's names and layouts. What it
cannot hold is CLIP's text tower that M3AE builds and never uses
(vision_encoder.token_embedding, .positional_embedding, .ln_final): their
sizes are CLIP's, not the model's. They come from --clip-text-from (the
pretrained m3ae.ckpt, a saved state_dict, or its .safetensors), whose values
a fine-tuned M3AE checkpoint carries unchanged, or else as zeros of ViT-B/16's
text tower (49408 x 512 tokens, 77 positions). The result is what
M3AETransformerSS of a VQA fine-tuning (loss_names {"vqa": 1}) takes with
load_state_dict(..., strict=True); -o FILE.ckpt writes it Lightning-style as
{"state_dict": ...} (for M3AE's load_path), any other name the bare
state_dict. Only torch is needed (Debian's python3-torch).
"""
import argparse
import collections
import importlib.util
import json
import os
import struct
import sys

try:
    import torch
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("m3ae_from_safetensors.py: needs PyTorch (Debian: apt-get install python3-torch; "
             "run it with /usr/bin/python3)")

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
# CLIP ViT-B/16's text tower, as M3AE's build_model("ViT-B/16") makes it.
CLIP_TEXT = {"vision_encoder.token_embedding.weight": (49408, 512),
             "vision_encoder.positional_embedding": (77, 512),
             "vision_encoder.ln_final.weight": (512,),
             "vision_encoder.ln_final.bias": (512,)}


def fail(message):
    raise SystemExit(f"m3ae_from_safetensors.py: {message}")


def read_safetensors(path):
    """{name: tensor} of a safetensors file, in the file's dtypes."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        fail(f"cannot read {path}: {error}")
    if len(data) < 8:
        fail(f"{path}: {len(data)} bytes, not a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + length])
    except ValueError as error:
        fail(f"{path}: the header is not JSON ({error})")
    tensors = collections.OrderedDict()
    for name, entry in sorted(header.items()):
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + length + begin:8 + length + end])
        flat = torch.frombuffer(raw, dtype=DTYPES[entry["dtype"]]) if raw else \
            torch.empty(0, dtype=DTYPES[entry["dtype"]])
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return tensors


def read_pretrained(path):
    """The state_dict of an M3AE checkpoint, a saved state_dict or its safetensors."""
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    spec = importlib.util.spec_from_file_location(
        "m3ae_to_safetensors", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "m3ae_to_safetensors.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_state_dict(path)


def m3ae_state_dict(path, clip_text_from=None):
    """The state_dict M3AETransformerSS (VQA) loads with strict=True."""
    state = read_safetensors(path)
    for name in CLIP_TEXT:
        if name in state:
            fail(f"{path} already holds {name}; is it vqa_train --export-m3ae's file?")
    if "vqa_head.3.weight" not in state:
        fail(f"{path} has no vqa_head.3.weight; is it vqa_train --export-m3ae's file?")
    source = read_pretrained(clip_text_from) if clip_text_from else None
    for name, shape in CLIP_TEXT.items():
        if source is None:
            state[name] = torch.zeros(shape)
        elif name not in source:
            fail(f"{clip_text_from} has no {name}")
        else:
            state[name] = source[name].float().clone()
    return collections.OrderedDict(sorted(state.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("safetensors", help="vqa_train --export-m3ae's file")
    parser.add_argument("-o", "--output", required=True,
                        help="FILE.ckpt: {'state_dict': ...}; any other name: the state_dict")
    parser.add_argument("--clip-text-from", metavar="PRETRAINED",
                        help="m3ae.ckpt (or a state_dict, or its .safetensors) to take CLIP's "
                             "unused text tower from; default: zeros of ViT-B/16's sizes")
    args = parser.parse_args()
    state = m3ae_state_dict(args.safetensors, args.clip_text_from)
    payload = {"state_dict": state} if args.output.endswith(".ckpt") else state
    temporary = args.output + ".partial"
    try:
        torch.save(payload, temporary)
        os.replace(temporary, args.output)
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        fail(f"cannot write {args.output}: {error}")
    values = sum(t.numel() for t in state.values())
    print(f"m3ae_from_safetensors.py: wrote {len(state)} tensors ({values / 1e6:.2f}M values) "
          f"to {args.output}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Stand-ins for M3AE's recipe inputs, for the tests that run it without them.

    recipe_stand_ins.py ROOT DATASET_DIR

Writes ROOT/DATASET_DIR: VQA-RAD's layout (trainset.json, testset.json,
images/; the docs test's 9 questions on 3 images), and
ROOT/models/roberta-base/{vocab.json,merges.txt}: a tokenizer with
roberta-base's size (50265 tokens) and special ids (<s> 0, <pad> 1, </s> 2,
<unk> 3), GPT-2's byte alphabet, 26 merges and filler tokens.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
import docs_commands  # noqa: E402  (stand_in_vqa_rad)

root, dataset_dir = sys.argv[1:3]
docs_commands.stand_in_vqa_rad(os.path.join(root, dataset_dir))
byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
             [chr(c) for c in range(174, 256)]
byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
letters = "abcdefghijklmnopqrstuvwxyz"
tokens = ["<s>", "<pad>", "</s>", "<unk>"] + byte_chars + ["Ġ" + c for c in letters]
tokens += [f"filler{i}" for i in range(50265 - len(tokens))]
folder = os.path.join(root, "models", "roberta-base")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "vocab.json"), "w") as f:
    json.dump({t: i for i, t in enumerate(tokens)}, f)
with open(os.path.join(folder, "merges.txt"), "w") as f:
    f.write("#version: 0.2\n" + "".join(f"Ġ {c}\n" for c in letters))

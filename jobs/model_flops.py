"""Forward FLOPs per sample of vqa_train's model, its matrix products counted
from the sizes on its `model:` log line (tests/gpu/check.sh and
jobs/bench_gpu.sh turn them into model FLOP utilisation: x3 for forward and
backward, over the GPU's peak). Imported, not run."""

import re


def model_sizes(model_line):
    """The `key=value` fields of a `model:` log line, as strings."""
    return dict(re.findall(r"(\w+)=(\S+)", model_line))


def forward_flops(sizes, question_tokens):
    """Forward FLOPs per sample: the patch embedding, every block's
    projections, feed-forward and attention products, and the fusion's cross
    attention, for `question_tokens` text tokens."""
    h, ffn, p, s = (int(sizes[k]) for k in ("hidden", "ffn", "patch_size", "image_size"))
    tv = (s // p) ** 2 + 1  # image tokens, class token included
    tt = int(question_tokens)

    def layer(t):  # projections + attention
        return 2 * t * (4 * h * h + 2 * h * ffn) + 4 * t * t * h

    def cross(a, b):
        return layer(a) + 2 * (2 * a * h * h + 2 * b * h * h) + 4 * a * b * h

    vision = 2 * tv * 3 * p * p * h + int(sizes["vision_layers"]) * layer(tv)
    text = int(sizes["text_layers"]) * layer(tt)
    fusion = int(sizes["fusion_layers"]) * (cross(tt, tv) + cross(tv, tt)) + 2 * (tt + tv) * h * h
    return vision + text + fusion

#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference for vqa-hpc's training step.

    python3 jobs/ddp_reference.py --preset small --ranks 2 --batch-per-rank 16 \
        --vocab-size V --num-answers K --image-size 96 --question-length L

Trains the same M3AE-style model as `vqa_train --preset P` for a few steps
with PyTorch DDP (gloo backend, CPU) and prints ONE line of JSON on stdout
(rank 0) with the samples per second:

    {"impl": "pytorch-ddp", "ranks": 2, ..., "parameters": N, "samples_per_second": S}

On a GPU (`--device cuda`) it runs the same model and step as a PyTorch user
who knows the library would write it for speed, each choice a flag
(jobs/bench_gpu.sh sets them):

    python3 jobs/ddp_reference.py --device cuda --precision bf16 --attention sdpa \
        --fused-adamw --compile reduce-overhead --preset base ...

  --precision bf16|fp16  torch.autocast around forward and loss (fp16 with
                         GradScaler); fp32 with --tf32 on|off|default
                         (torch.backends.cuda.matmul.allow_tf32 and
                         torch.backends.cudnn.allow_tf32; default leaves
                         PyTorch's: matmul off, cuDNN on, as vqa_train does)
  --attention sdpa       F.scaled_dot_product_attention (flash or
                         memory-efficient kernels), same parameters
  --fused-adamw          torch.optim.AdamW(fused=True)
  --compile MODE         torch.compile(model, mode=MODE); the warm-up steps
                         include compilation and are timed apart
  --gradient-as-bucket-view  passed to DDP (ranks > 1)
On 1 rank with --device cuda the model runs without DDP ("ddp": false); more
ranks use DDP over NCCL, one GPU per rank. Exit status 3 (and one line on
stderr) when the installed PyTorch lacks what a flag asks for
(torch.compile, F.scaled_dot_product_attention, fused AdamW).

Beside samples/s the line holds what the step costs (after the timed steps,
2 more steps run under torch.profiler, --profile-steps):
  step_seconds_median    the median of the timed steps (CUDA events on a GPU)
  peak_memory_bytes      torch.cuda.max_memory_allocated over the timed steps;
                         on the CPU the resident set's high-water mark (VmHWM,
                         reset before the timed steps), as vqa_train reports it
  operators_per_step     operators dispatched on the host per profiled step,
                         counted as vqa_train's --profile counts them
                         (RecordFunction events of function scope; CUDA
                         runtime calls and user scopes left out)
  kernels_per_step       GPU kernels per profiled step (copies and memsets
                         left out); graph_launches_per_step: CUDA graph
                         launches (--compile reduce-overhead)
  gpu_busy_seconds_per_step, gpu_idle_seconds_per_step   the union of the
                         kernels' intervals, and the gaps between them
  host_seconds_per_step  process CPU time (time.process_time, all threads)
                         over the timed steps / steps; on a GPU it includes
                         the host's waits for room in the launch queue
  host_operator_seconds_per_step  wall time per profiled step inside host
                         operators (the union of their intervals, all threads)

Every size of vqa_train's model can be given (--hidden, --vision-layers, ...,
the names of its `model:` log line), and its structure (--vision-activation,
--layer-norm-eps, --text-positions, --text-token-type: the line's
vision_activation, layer_norm_eps, text_positions, text_token_type; the base
preset has M3AE's); jobs/ddp_setup.sh passes all of them from that line, so
flags given to vqa_train reach this model too. `--count-only` builds the
model, prints the same line without timing (parameters only) and exits; the
bench scripts use it to check that this model and vqa_train's have exactly
the same parameter count.

Launcher: torch.multiprocessing.spawn inside this script (one process per
rank, the same processes `python3 -m torch.distributed.run` would start), so
that one command gives one result line. The rendezvous is TCP on 127.0.0.1 at
a free port (or --port).

Across hosts (real ones, or jobs/emulated_hosts.sh's network namespaces) a
spawn cannot reach the other machine, so `--rank R --world-size N --master
ADDR:PORT` runs just rank R in this process, started once per host by
whatever starts processes there (jobs/bench_slow_link.sh: `emulated_hosts.sh
exec`); rank 0 listens for the rendezvous on ADDR:PORT, which must be its own
address on the link between the hosts, and prints the result line. Gloo
takes the address it talks on from the host name, and falls back to loopback
when the name resolves to nothing, as an emulated host's does: the other host
cannot reach that, so each rank needs GLOO_SOCKET_IFNAME set to the link's
interface (vqa0 on the emulated hosts).

    python3 jobs/ddp_reference.py ... --rank 0 --world-size 2 --master 10.201.0.1:29500 &
    python3 jobs/ddp_reference.py ... --rank 1 --world-size 2 --master 10.201.0.1:29500   # on host 1

What is the same as vqa_train (so that the comparison is of the two
training loops, not of two workloads):
  - the model, layer for layer (src/model/*.cpp): ViT with pre-LN blocks and a
    bias-free patch convolution, RoBERTa-style post-LN text encoder,
    co-attention fusion (self-, cross-attention, feed-forward per side), the
    VQA head; attention written out as matmul / softmax / matmul with
    contiguous heads (--attention torch: through nn.MultiheadAttention
    instead, PyTorch's usual module; sdpa: F.scaled_dot_product_attention);
    exact GELU (the base preset's vision blocks: CLIP's QuickGELU); the same
    LayerNorm epsilons per part, RoBERTa's positions and token-type row where
    the preset has them (base), the same initialisation; the same parameter
    count (checked by the bench scripts);
  - the inputs' shapes: [B, 3, S, S] float images, [B, L] int64 token ids and
    padding mask, [B, K] soft targets; the vocabulary, L, K and S are those of
    the dataset vqa_train reads (passed on the command line);
  - the loss: BCE with logits on soft targets, mean x K;
  - the optimiser: AdamW, betas (0.9, 0.98), eps 1e-8, six parameter groups
    ({encoders, fusion, head} x {decay, no decay on biases and LayerNorm
    weights}) with lr x1 / x5 / x50, set every step;
  - the batch per rank, 1 CPU thread per rank, the same LibTorch and BLAS
    (Debian's python3-torch runs on the libtorch_cpu that vqa_train links);
  - data parallelism: the gradient is averaged across ranks every step in
    buckets of 25 MiB that go out while backward runs (vqa_train's default
    --bucket-mb 25 and DDP's default bucket_cap_mb 25);
  - the timed region: after as many warm-up steps as the scaling script gives
    (it passes vqa_train's warm-up epoch), the steps between two barriers
    (on a GPU after the queued work is done), on rank 0.

What differs:
  - the launcher and the collective library (torch.multiprocessing + gloo
    over TCP on loopback here, or over the hosts' link with --rank; mpirun +
    Open MPI shared memory or TCP in vqa_train): that is part of what is
    compared;
  - the data: here a few batches of random inputs made before the timed
    steps and reused (no loading at all); vqa_train reads every batch from
    its HDF5 file on a background thread, which is inside its timing. This
    favours DDP;
  - DDP's own defaults are kept (find_unused_parameters=False,
    broadcast_buffers=True, gradient_as_bucket_view=False, unless
    --gradient-as-bucket-view), unless
    --find-unused-parameters: many users' own training loops turn it on
    because a model of theirs once had a branch without gradient, and keep it;
    it costs a traversal of the autograd graph after every forward, so the
    row with it is what such a loop gets, next to DDP at its best; the
    optimiser runs
    PyTorch 1.13's default single-tensor AdamW (`--foreach` switches to the
    multi-tensor one); gradients are reset with zero_grad(set_to_none=True),
    PyTorch 2's default and the cheaper choice.
"""

import argparse
import contextlib
import inspect
import json
import math
import os
import re
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# src/model/layers.cpp: the additive score of a padded key.
MASKED_SCORE = -1e4
# src/model/m3ae.h: std of the normal initialisation.
INIT_STD = 0.02
# src/model/model_config.cpp: RoBERTa's vocabulary, the preset's default.
ROBERTA_VOCAB_SIZE = 50265

# RoBERTa's padding_idx (src/model/text_encoder.cpp): the position row of padding;
# a real token's position is 1 + its rank among the real tokens.
ROBERTA_PADDING_INDEX = 1

# src/model/model_config.h: the structure tiny and small keep; base changes it to
# M3AE's (CLIP's QuickGELU in the vision blocks, roberta-base's LayerNorm
# epsilon in the text encoder and M3AE's in the head, RoBERTa's positions and
# token-type row). LayerNorm epsilons: vision / text / fusion / head.
STRUCTURE_DEFAULTS = dict(vision_activation="gelu", layer_norm_eps=(1e-5, 1e-12, 1e-12, 1e-12),
                          text_positions="plain", text_token_type=False)

# src/model/model_config.cpp, model_config_preset(). vocab_size, num_answers and
# image_size are overridden by the dataset, as vqa_train does.
PRESETS = {
    "tiny": dict(hidden=64, heads=2, ffn=256, vision_layers=1, text_layers=1, fusion_layers=1,
                 image_size=32, patch_size=8, vocab_size=1024, max_text_length=32,
                 num_answers=10, dropout=0.0, **STRUCTURE_DEFAULTS),
    "small": dict(hidden=256, heads=4, ffn=1024, vision_layers=4, text_layers=4, fusion_layers=2,
                  image_size=96, patch_size=16, vocab_size=ROBERTA_VOCAB_SIZE,
                  max_text_length=64, num_answers=100, dropout=0.0, **STRUCTURE_DEFAULTS),
    # M3AE: CLIP ViT-B/16 less its last block at 384 px, RoBERTa-base, six
    # co-attention layers per side; 512 positions (RoBERTa's 514 rows less
    # the two offset rows).
    "base": dict(hidden=768, heads=12, ffn=3072, vision_layers=11, text_layers=12,
                 fusion_layers=6, image_size=384, patch_size=16, vocab_size=ROBERTA_VOCAB_SIZE,
                 max_text_length=512, num_answers=500, dropout=0.1,
                 vision_activation="quick_gelu", layer_norm_eps=(1e-5, 1e-5, 1e-12, 1e-5),
                 text_positions="roberta", text_token_type=True),
}


def attention_key_bias(attention_mask, dtype):
    """[B, L] mask (non-zero = real) -> [B, 1, 1, L] additive bias."""
    return (attention_mask.eq(0).to(dtype) * MASKED_SCORE).unsqueeze(1).unsqueeze(2)


class MultiHeadAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden, bias=False)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.attention_dropout = nn.Dropout(dropout)

    def forward(self, queries, keys_values, key_bias):
        batch, query_length, hidden = queries.shape
        head_size = hidden // self.heads

        def split_heads(x):
            return x.view(batch, x.size(1), self.heads, head_size).transpose(1, 2).contiguous()

        q = split_heads(self.query(queries))
        k = split_heads(self.key(keys_values))
        v = split_heads(self.value(keys_values))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_size)
        if key_bias is not None:
            scores = scores + key_bias
        probabilities = self.attention_dropout(torch.softmax(scores, dim=-1))
        context = torch.matmul(probabilities, v).transpose(1, 2).reshape(batch, query_length,
                                                                         hidden)
        return self.output(context)


class SdpaAttention(nn.Module):
    """The explicit attention's parameters (query, key without bias, value,
    output) around F.scaled_dot_product_attention (PyTorch 2.0+: flash or
    memory-efficient kernels on a GPU), as vqa_train's fused path on
    LibTorch 2.x: padded keys as the additive bias in the queries' dtype
    (under autocast q, k and v are bfloat16 or float16); no mask where every
    key is real, which lets the flash kernel run."""

    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden, bias=False)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def forward(self, queries, keys_values, key_bias):
        batch, query_length, hidden = queries.shape
        head_size = hidden // self.heads

        def split_heads(x):
            return x.view(batch, x.size(1), self.heads, head_size).transpose(1, 2)

        q = split_heads(self.query(queries))
        k = split_heads(self.key(keys_values))
        v = split_heads(self.value(keys_values))
        mask = None if key_bias is None else key_bias.to(q.dtype)
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.output(context.transpose(1, 2).reshape(batch, query_length, hidden))


class TorchAttention(nn.Module):
    """The same attention through PyTorch's own module, as a PyTorch user
    would write it: nn.MultiheadAttention (one packed in-projection GEMM for
    self-attention, F.multi_head_attention_forward), padded keys as an
    additive key_padding_mask. Its in-projection has a key bias, which
    vqa_train's model leaves out (it always gets a zero gradient): that
    slice is not counted in "parameters" (see counted_parameters)."""

    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.attention = nn.MultiheadAttention(hidden, heads, dropout=dropout, batch_first=True)

    def forward(self, queries, keys_values, key_bias):
        padding = None if key_bias is None else key_bias.view(key_bias.size(0), -1)
        return self.attention(queries, keys_values, keys_values, key_padding_mask=padding,
                              need_weights=False)[0]


ATTENTION_MODULES = {"explicit": MultiHeadAttention, "torch": TorchAttention,
                     "sdpa": SdpaAttention}
attention_module = MultiHeadAttention  # main() sets it from --attention


def make_attention(hidden, heads, dropout):
    return attention_module(hidden, heads, dropout)


def counted_parameters(model):
    """Parameters as vqa_train counts them: without the key biases that only
    nn.MultiheadAttention has (hidden values per attention module)."""
    total = sum(p.numel() for p in model.parameters())
    key_biases = sum(m.attention.embed_dim for m in model.modules() if isinstance(m, TorchAttention))
    return total - key_biases


class FeedForward(nn.Module):
    def __init__(self, hidden, ffn, activation="gelu"):
        super().__init__()
        self.quick_gelu = activation == "quick_gelu"
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        inner = self.up(x)
        if self.quick_gelu:  # CLIP's x * sigmoid(1.702 x)
            return self.down(inner * torch.sigmoid(1.702 * inner))
        return self.down(F.gelu(inner))


class PreNormBlock(nn.Module):
    def __init__(self, hidden, heads, ffn, eps, activation):
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.attention = make_attention(hidden, heads, 0.0)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=eps)
        self.feed_forward = FeedForward(hidden, ffn, activation)

    def forward(self, x):
        normed = self.attention_norm(x)
        after_attention = x + self.attention(normed, normed, None)
        return after_attention + self.feed_forward(self.feed_forward_norm(after_attention))


class PostNormLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, dropout, eps):
        super().__init__()
        self.attention = make_attention(hidden, heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.feed_forward = FeedForward(hidden, ffn)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, key_bias):
        attended = self.attention_norm(x + self.dropout(self.attention(x, x, key_bias)))
        return self.feed_forward_norm(attended + self.dropout(self.feed_forward(attended)))


class CoAttentionLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, dropout, eps):
        super().__init__()
        self.self_attention = make_attention(hidden, heads, dropout)
        self.self_attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.cross_attention = make_attention(hidden, heads, dropout)
        self.cross_attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.feed_forward = FeedForward(hidden, ffn)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, x_key_bias, other, other_key_bias):
        self_attended = self.self_attention_norm(
            x + self.dropout(self.self_attention(x, x, x_key_bias)))
        cross_attended = self.cross_attention_norm(
            self_attended +
            self.dropout(self.cross_attention(self_attended, other, other_key_bias)))
        return self.feed_forward_norm(cross_attended +
                                      self.dropout(self.feed_forward(cross_attended)))


class VisionTransformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        hidden, eps = c["hidden"], c["layer_norm_eps"][0]
        patches = (c["image_size"] // c["patch_size"]) ** 2
        self.patch_embedding = nn.Conv2d(3, hidden, c["patch_size"], stride=c["patch_size"],
                                         bias=False)
        self.class_token = nn.Parameter(torch.zeros(hidden))
        self.position_embeddings = nn.Parameter(torch.zeros(1 + patches, hidden))
        self.input_norm = nn.LayerNorm(hidden, eps=eps)
        self.blocks = nn.ModuleList(
            PreNormBlock(hidden, c["heads"], c["ffn"], eps, c["vision_activation"])
            for _ in range(c["vision_layers"]))
        self.output_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, images):
        patches = self.patch_embedding(images).flatten(2).transpose(1, 2)
        batch = patches.size(0)
        class_tokens = self.class_token.view(1, 1, -1).expand(batch, 1, -1)
        sequence = torch.cat([class_tokens, patches], dim=1)
        x = self.input_norm(sequence + self.position_embeddings[:sequence.size(1)])
        for block in self.blocks:
            x = block(x)
        return self.output_norm(x)


class TextEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        hidden, eps, dropout = c["hidden"], c["layer_norm_eps"][1], c["dropout"]
        self.roberta_positions = c["text_positions"] == "roberta"
        position_rows = c["max_text_length"] + (ROBERTA_PADDING_INDEX + 1
                                                 if self.roberta_positions else 0)
        self.token_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(position_rows, hidden)
        # RoBERTa's token_type_embeddings with its single type: one row added to every token.
        self.token_type_embeddings = nn.Embedding(1, hidden) if c["text_token_type"] else None
        self.embedding_norm = nn.LayerNorm(hidden, eps=eps)
        self.embedding_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            PostNormLayer(hidden, c["heads"], c["ffn"], dropout, eps)
            for _ in range(c["text_layers"]))

    def forward(self, token_ids, attention_mask, key_bias):
        x = self.token_embeddings(token_ids)
        if self.roberta_positions:
            real = attention_mask.ne(0).long()
            x = x + self.position_embeddings(real.cumsum(1) * real + ROBERTA_PADDING_INDEX)
        else:
            x = x + self.position_embeddings.weight[:token_ids.size(1)]
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings.weight[0]
        x = self.embedding_dropout(self.embedding_norm(x))
        for layer in self.layers:
            x = layer(x, key_bias)
        return x


class CoAttentionFusion(nn.Module):
    def __init__(self, c):
        super().__init__()
        hidden = c["hidden"]
        self.text_projection = nn.Linear(hidden, hidden)
        self.image_projection = nn.Linear(hidden, hidden)
        self.modality_type_embeddings = nn.Embedding(2, hidden)

        def layer():
            return CoAttentionLayer(hidden, c["heads"], c["ffn"], c["dropout"],
                                    c["layer_norm_eps"][2])

        self.text_layers = nn.ModuleList(layer() for _ in range(c["fusion_layers"]))
        self.image_layers = nn.ModuleList(layer() for _ in range(c["fusion_layers"]))

    def forward(self, text, text_key_bias, image):
        type_table = self.modality_type_embeddings.weight
        x = self.text_projection(text) + type_table[0]
        y = self.image_projection(image) + type_table[1]
        for text_layer, image_layer in zip(self.text_layers, self.image_layers):
            x, y = text_layer(x, text_key_bias, y, None), image_layer(y, None, x, text_key_bias)
        return x, y


class VqaHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        hidden = c["hidden"]
        self.text_pooler = nn.Linear(hidden, hidden)
        self.image_pooler = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(2 * hidden, 2 * hidden)
        self.norm = nn.LayerNorm(2 * hidden, eps=c["layer_norm_eps"][3])
        self.output = nn.Linear(2 * hidden, c["num_answers"])

    def forward(self, text, image):
        pooled = torch.cat([torch.tanh(self.text_pooler(text[:, 0])),
                            torch.tanh(self.image_pooler(image[:, 0]))], dim=1)
        return self.output(F.gelu(self.norm(self.dense(pooled))))


class M3AE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.vision = VisionTransformer(c)
        self.text = TextEncoder(c)
        self.fusion = CoAttentionFusion(c)
        self.head = VqaHead(c)
        self._initialize()

    def _initialize(self):
        # BERT's rule, as src/model/m3ae.cpp: LayerNorm 1 / 0, biases 0, the rest N(0, 0.02).
        with torch.no_grad():
            for module in self.modules():
                for name, parameter in module.named_parameters(recurse=False):
                    if name.endswith("bias"):  # nn.MultiheadAttention's in_proj_bias too
                        parameter.zero_()
                    elif isinstance(module, nn.LayerNorm):
                        parameter.fill_(1.0)
                    else:
                        parameter.normal_(0.0, INIT_STD)

    def forward(self, images, token_ids, attention_mask):
        image_tokens = self.vision(images)
        text_key_bias = attention_key_bias(attention_mask, images.dtype)
        text_tokens = self.text(token_ids, attention_mask, text_key_bias)
        fused_text, fused_image = self.fusion(text_tokens, text_key_bias, image_tokens)
        return self.head(fused_text, fused_image)


# The model fields a command-line flag may override, as vqa_train's
# `model:` log line names them (jobs/bench_scaling.sh passes that line's values).
MODEL_FIELDS = ("hidden", "heads", "ffn", "vision_layers", "text_layers", "fusion_layers",
                "image_size", "patch_size", "vocab_size", "max_text_length", "num_answers")


def parse_layer_norm_eps(text):
    """"V/T/F/H" (the `model:` line's layer_norm_eps(vision/text/fusion/head)) -> 4 floats."""
    try:
        values = tuple(float(part) for part in text.split("/"))
    except ValueError:
        values = ()
    if len(values) != 4 or not all(value > 0 and math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(
            f"must be four positive numbers vision/text/fusion/head, e.g. 1e-05/1e-12/1e-12/1e-12, "
            f"got '{text}'")
    return values


def model_config(args):
    c = dict(PRESETS[args.preset])
    for field in MODEL_FIELDS:
        value = getattr(args, field)
        if value:
            c[field] = value
    if args.dropout is not None:
        c["dropout"] = args.dropout
    for field in ("vision_activation", "layer_norm_eps", "text_positions"):
        if getattr(args, field) is not None:
            c[field] = getattr(args, field)
    if args.text_token_type is not None:
        c["text_token_type"] = args.text_token_type == "true"
    # As vqa_train's setup_model_config(): the position table covers the
    # dataset's questions.
    c["max_text_length"] = max(c["max_text_length"], args.question_length or 0)
    for field in MODEL_FIELDS:
        if c[field] < 1:
            sys.exit(f"ddp_reference.py: {field} must be positive, got {c[field]}")
    if c["hidden"] % c["heads"] != 0:
        sys.exit(f"ddp_reference.py: hidden {c['hidden']} is not a multiple of heads {c['heads']}")
    if c["image_size"] % c["patch_size"] != 0:
        sys.exit(f"ddp_reference.py: image size {c['image_size']} is not a multiple of the "
                 f"patch size {c['patch_size']}")
    return c


def parameter_groups(model, lr, weight_decay, fusion_multiplier, head_multiplier):
    """Six AdamW groups as src/train/optimizer.cpp; returns (groups, multipliers)."""
    no_decay = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, nn.LayerNorm) or name.endswith("bias"):
                no_decay.add(id(parameter))
    part_index = {"vision": 0, "text": 0, "fusion": 1, "head": 2}
    tensors = [[] for _ in range(6)]
    for name, parameter in model.named_parameters():
        group = part_index[name.split(".")[0]] * 2 + (1 if id(parameter) in no_decay else 0)
        tensors[group].append(parameter)
    multiplier = (1.0, fusion_multiplier, head_multiplier)
    groups, multipliers = [], []
    for group, params in enumerate(tensors):
        if params:
            groups.append({"params": params, "lr": lr * multiplier[group // 2],
                           "weight_decay": weight_decay if group % 2 == 0 else 0.0})
            multipliers.append(multiplier[group // 2])
    return groups, multipliers


def make_batches(c, batch, question_length, count, seed):
    """`count` batches of random inputs with the dataset's shapes and types."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        images = torch.randn(batch, 3, c["image_size"], c["image_size"], generator=generator)
        lengths = torch.randint(1, question_length + 1, (batch, 1), generator=generator)
        mask = (torch.arange(question_length).unsqueeze(0) < lengths).to(torch.int64)
        first_word = 3 if c["vocab_size"] > 3 else 0  # after <pad>, <unk>, <cls>
        token_ids = torch.randint(first_word, c["vocab_size"], (batch, question_length),
                                  generator=generator) * mask
        token_ids[:, 0] = 2  # <cls>
        targets = torch.zeros(batch, c["num_answers"])
        labels = torch.randint(0, c["num_answers"], (batch,), generator=generator)
        targets[torch.arange(batch), labels] = 1.0
        batches.append((images, token_ids, mask, targets))
    return batches


def vqa_loss(logits, targets):
    return F.binary_cross_entropy_with_logits(logits.float(), targets) * targets.size(1)


def torch_version():
    """(major, minor) of the imported PyTorch, e.g. (1, 13) or (2, 6)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def run_rank(rank, args, init_method):
    global attention_module  # a spawned process imports this file afresh
    attention_module = ATTENTION_MODULES[args.attention]
    torch.set_num_threads(args.threads)
    # PyTorch 2.4 made the TCP rendezvous store use libuv by default, and
    # Debian's python3-torch 2.x is built without it ("use_libuv was requested
    # but PyTorch was build without libuv support"): ask for the store 1.x
    # always uses, unless USE_LIBUV is set.
    if torch_version() >= (2, 4):
        os.environ.setdefault("USE_LIBUV", "0")
    cuda = args.device == "cuda"
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", local_gpu_index(rank, args))
        torch.cuda.set_device(device)
        set_tf32(args.tf32)
    if uses_ddp(args):
        dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank,
                                world_size=args.ranks)
    c = model_config(args)
    torch.manual_seed(args.seed)
    model = M3AE(c)
    parameters = counted_parameters(model)
    model.to(device)
    net = model
    if uses_ddp(args):
        net = DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                      bucket_cap_mb=args.bucket_mb,
                                      find_unused_parameters=args.find_unused_parameters,
                                      gradient_as_bucket_view=args.gradient_as_bucket_view)
    if args.compile != "none":
        net = torch.compile(net, mode=args.compile)
    groups, multipliers = parameter_groups(model, args.lr, 0.01, 5.0, 50.0)
    adamw = dict(lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    if args.fused_adamw:
        adamw["fused"] = True
    else:
        adamw["foreach"] = args.foreach
    optimizer = torch.optim.AdamW(groups, **adamw)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = make_grad_scaler() if args.precision == "fp16" else None
    # CUDA graphs (reduce-overhead) reuse their output buffers: each step
    # tells the graph tree that the previous step's outputs are dead.
    mark_step = (getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
                 if args.compile == "reduce-overhead" else None)
    question_length = args.question_length or c["max_text_length"]
    batches = [tuple(t.to(device) for t in batch)
               for batch in make_batches(c, args.batch_per_rank, question_length, 4,
                                         args.seed * 1000 + rank)]

    def step(index):
        images, token_ids, mask, targets = batches[index % len(batches)]
        if mark_step is not None:
            mark_step()
        with (torch.autocast(device_type=args.device, dtype=autocast_dtype)
              if autocast_dtype is not None else contextlib.nullcontext()):
            loss = vqa_loss(net(images, token_ids, mask), targets)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        # Constant lr here; vqa_train sets each group's lr from its schedule
        # every step, which this mirrors in cost.
        for group, multiplier in zip(optimizer.param_groups, multipliers):
            group["lr"] = args.lr * multiplier
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def settle():
        """Waits for the GPU's queued work and, with DDP, for every rank."""
        if cuda:
            torch.cuda.synchronize()
        if uses_ddp(args):
            dist.barrier(**({"device_ids": [device.index]} if cuda else {}))

    warmup_start = time.perf_counter()
    for index in range(args.warmup_steps):
        step(index)
    settle()
    warmup_seconds = time.perf_counter() - warmup_start
    peak_source = reset_peak_memory(device)
    # Step boundaries: CUDA events on the stream (no host sync inside the
    # timed loop), the host clock on the CPU, where a step ends when it returns.
    marks = ([torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)] if cuda
             else [0.0] * (args.steps + 1))

    def mark(i):
        if cuda:
            marks[i].record()
        else:
            marks[i] = time.perf_counter()

    cpu_start = time.process_time()
    start = time.perf_counter()
    mark(0)
    for index in range(args.steps):
        step(args.warmup_steps + index)
        mark(index + 1)
    settle()
    seconds = time.perf_counter() - start
    host_seconds = time.process_time() - cpu_start
    step_times = ([marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(args.steps)] if cuda
                  else [marks[i + 1] - marks[i] for i in range(args.steps)])
    peak_memory = peak_memory_bytes(device)
    profile = profile_steps(step, args.warmup_steps + args.steps, args.profile_steps,
                            rank == 0, cuda, settle)
    if rank == 0:
        samples = args.ranks * args.batch_per_rank * args.steps
        median = statistics.median(step_times)
        gpu = ({"gpu": torch.cuda.get_device_name(device),
                "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                "tf32_cudnn": torch.backends.cudnn.allow_tf32} if cuda else {})
        print_result(args, c, parameters, **gpu, seconds=seconds, samples=samples,
                     samples_per_second=samples / seconds,
                     step_seconds=seconds / max(1, args.steps),
                     step_seconds_median=median,
                     samples_per_second_median=args.ranks * args.batch_per_rank / median,
                     warmup_seconds=warmup_seconds,
                     compile_seconds=warmup_seconds if args.compile != "none" else None,
                     peak_memory_bytes=peak_memory,
                     peak_memory_source=peak_source,
                     host_seconds_per_step=host_seconds / args.steps, **profile)
    if uses_ddp(args):
        dist.destroy_process_group()


def uses_ddp(args):
    """DDP on the CPU always (the scaling reports compare it at 1 rank too), on
    GPUs from 2 ranks: one GPU trains the plain model, as anyone would."""
    return args.device == "cpu" or args.ranks > 1


def local_gpu_index(rank, args):
    """Spawned ranks share this host: rank r on GPU r. One rank per process
    (--rank): LOCAL_RANK when the launcher sets it, else rank mod the GPUs."""
    if args.rank is None:
        return rank
    return int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))


def set_tf32(mode):
    """--tf32 on|off sets both TF32 switches; default leaves PyTorch's
    (matmul off, cuDNN on), which is what vqa_train runs with."""
    if mode != "default":
        torch.backends.cuda.matmul.allow_tf32 = mode == "on"
        torch.backends.cudnn.allow_tf32 = mode == "on"


def make_grad_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # PyTorch 2.3+
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def reset_peak_memory(device):
    """Starts the peak-memory count afresh; returns what will be counted."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "GPU allocated (PyTorch)"
    try:  # "5" resets VmHWM to the current resident set (Linux 4.0+), as vqa_train does
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return "resident set (VmHWM)"
    except OSError:
        return "resident set (VmHWM, since the process started)"


def peak_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# CUDA runtime and driver calls (cudaLaunchKernel, cuLaunchKernel, ...):
# host events of the profiler that are not operators.
CUDA_API_CALL = re.compile(r"cu(da)?[A-Z]")
# RecordScope::FUNCTION: an operator (not an autograd node, not a user scope
# such as record_function or the optimiser's step).
FUNCTION_SCOPE = 0


def profile_steps(step, first_index, count, profiling, cuda, settle):
    """Runs `count` more steps (every rank) under torch.profiler on the
    profiling rank, from an idle GPU; returns the per-step counts and times."""
    if count < 1:
        return {}
    settle()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with (torch.profiler.profile(activities=activities) if profiling
          else contextlib.nullcontext()) as profiler:
        for index in range(count):
            step(first_index + index)
        if cuda:
            torch.cuda.synchronize()
    settle()
    return summarize_profile(profiler, count, cuda) if profiling else {}


def profiled_events(profiler):
    """(name, on the GPU, scope, start s, end s) of every profiled event: the
    profiler's raw event list, which vqa_train's --profile reads too."""
    device_type = getattr(torch.autograd, "DeviceType", None) or torch._C._autograd.DeviceType
    results = getattr(profiler.profiler, "kineto_results", None)
    if results is None:  # a PyTorch that keeps only the parsed events
        for e in profiler.events():
            yield (e.name, e.device_type == device_type.CUDA, e.scope,
                   e.time_range.start / 1e6, e.time_range.end / 1e6)
        return
    for e in results.events():
        # Record_function ranges (the optimiser's step, compiled regions), also
        # drawn on the GPU's timeline in 2.x: neither operators nor kernels.
        if getattr(e, "is_user_annotation", lambda: False)():
            continue
        if hasattr(e, "start_ns"):  # PyTorch 2.x
            start, length = e.start_ns() / 1e9, e.duration_ns() / 1e9
        else:
            start, length = e.start_us() / 1e6, e.duration_us() / 1e6
        yield e.name(), e.device_type() == device_type.CUDA, e.scope(), start, start + length


def summarize_profile(profiler, steps, cuda):
    host, gpu = [], []
    operators = kernels = graph_launches = 0
    for name, on_gpu, scope, start, end in profiled_events(profiler):
        if on_gpu:
            gpu.append((start, end))
            if not name.startswith(("Memcpy", "Memset")):
                kernels += 1
        elif name.startswith("cudaGraphLaunch"):
            graph_launches += 1
        elif scope == FUNCTION_SCOPE and not CUDA_API_CALL.match(name):
            operators += 1
            host.append((start, end))
    busy = union_seconds(gpu)
    summary = {"profile_steps": steps, "operators_per_step": operators / steps,
               "host_operator_seconds_per_step": union_seconds(host) / steps,
               "kernels_per_step": None, "graph_launches_per_step": None,
               "gpu_busy_seconds_per_step": None, "gpu_idle_seconds_per_step": None}
    if cuda:
        span = max(end for _, end in gpu) - min(start for start, _ in gpu) if gpu else 0.0
        summary.update(kernels_per_step=kernels / steps,
                       graph_launches_per_step=graph_launches / steps,
                       gpu_busy_seconds_per_step=busy / steps,
                       gpu_idle_seconds_per_step=(span - busy) / steps)
    return summary


def union_seconds(intervals):
    """Length of the union of (start, end) intervals."""
    total, reached = 0.0, None
    for start, end in sorted(intervals):
        if reached is None or start >= reached:
            total += end - start
            reached = end
        elif end > reached:
            total += end - reached
            reached = end
    return total


def print_result(args, c, parameters, **timing):
    ddp = uses_ddp(args)
    record = {"impl": "pytorch-ddp", "torch": torch.__version__,
              "backend": ("nccl" if args.device == "cuda" else "gloo") if ddp else None,
              "preset": args.preset, "ranks": args.ranks, "threads_per_rank": args.threads,
              "batch_per_rank": args.batch_per_rank, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "bucket_mb": args.bucket_mb,
              "foreach": bool(args.foreach), "attention": args.attention,
              "find_unused_parameters": bool(args.find_unused_parameters),
              "launcher": ("one rank per process" if args.rank is not None
                           else "spawn" if ddp else "this process"),
              "device": args.device, "ddp": ddp, "precision": args.precision,
              "autocast": {"bf16": "bfloat16", "fp16": "float16"}.get(args.precision),
              "loss_scaling": args.precision == "fp16", "tf32": args.tf32,
              "tf32_matmul": None, "tf32_cudnn": None, "fused_adamw": bool(args.fused_adamw),
              "gradient_as_bucket_view": bool(args.gradient_as_bucket_view),
              "compile": args.compile, "parameters": parameters, "model": c}
    record.update(timing)
    print(json.dumps(record), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Exit status when the installed PyTorch lacks what a flag asks for; the
# bench scripts print the one-line reason in their table.
EXIT_UNSUPPORTED = 3


def require_features(args):
    """Exits with status 3 and one line naming what this PyTorch lacks."""
    version = torch.__version__
    missing = None
    if args.compile != "none" and not hasattr(torch, "compile"):
        missing = f"torch.compile not available in PyTorch {version} (it came with 2.0)"
    elif args.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        missing = (f"F.scaled_dot_product_attention not available in PyTorch {version} "
                   f"(it came with 2.0)")
    elif args.fused_adamw and "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        missing = (f"torch.optim.AdamW(fused=True) not available in PyTorch {version} "
                   f"(2.0 or later on CUDA)")
    elif args.fused_adamw and args.device == "cpu" and torch_version() < (2, 4):
        missing = (f"fused AdamW on the CPU not available in PyTorch {version} "
                   f"(2.4 or later; on CUDA 2.0 or later)")
    if missing:
        print(f"ddp_reference.py: {missing}", file=sys.stderr, flush=True)
        sys.exit(EXIT_UNSUPPORTED)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--question-length", type=int, default=0,
                        help="L, tokens per question of the dataset (0: max-text-length)")
    model = parser.add_argument_group(
        "model sizes and structure (0 or unset: the preset's; vqa_train takes vocabulary, "
        "answers and image size from the dataset)")
    for field in MODEL_FIELDS:
        model.add_argument("--" + field.replace("_", "-"), type=int, default=0)
    model.add_argument("--dropout", type=float, default=None, help="(default: the preset's)")
    model.add_argument("--vision-activation", choices=("gelu", "quick_gelu"), default=None,
                       help="the vision blocks' MLP activation (base: quick_gelu, CLIP's)")
    model.add_argument("--layer-norm-eps", type=parse_layer_norm_eps, default=None,
                       metavar="V/T/F/H",
                       help="LayerNorm epsilons of vision / text / fusion / head, as the "
                            "`model:` line's layer_norm_eps (base: 1e-05/1e-05/1e-12/1e-05)")
    model.add_argument("--text-positions", choices=("plain", "roberta"), default=None,
                       help="plain: positions 0..L-1; roberta: 1 + the rank among real "
                            "tokens, padding at row 1, 2 more rows (base)")
    model.add_argument("--text-token-type", choices=("true", "false"), default=None,
                       help="add RoBERTa's single token-type row to every token (base: true)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--batch-per-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first")
    parser.add_argument("--profile-steps", type=int, default=2,
                        help="steps after the timed ones under torch.profiler (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--foreach", action="store_true", help="multi-tensor AdamW")
    parser.add_argument("--attention", choices=sorted(ATTENTION_MODULES), default="explicit",
                        help="explicit: matmul / softmax / matmul as vqa_train's; torch: "
                             "nn.MultiheadAttention; sdpa: F.scaled_dot_product_attention "
                             "(PyTorch 2.0+)")
    parser.add_argument("--find-unused-parameters", action="store_true",
                        help="DistributedDataParallel(find_unused_parameters=True)")
    fast = parser.add_argument_group("device and speed")
    fast.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="cuda: rank r on GPU r, NCCL between ranks, no DDP on 1 rank")
    fast.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                      help="bf16 / fp16 (GPU only here): torch.autocast around "
                           "forward and loss; fp16 with GradScaler")
    fast.add_argument("--tf32", choices=("on", "off", "default"), default="default",
                      help="GPU: torch.backends.cuda.matmul.allow_tf32 and "
                           "torch.backends.cudnn.allow_tf32 (default: PyTorch's own, matmul "
                           "off and cuDNN on)")
    fast.add_argument("--fused-adamw", action="store_true",
                      help="torch.optim.AdamW(fused=True) (PyTorch 2.0+ on CUDA)")
    fast.add_argument("--gradient-as-bucket-view", action="store_true",
                      help="DistributedDataParallel(gradient_as_bucket_view=True)")
    fast.add_argument("--compile", choices=("none", "default", "reduce-overhead",
                                            "max-autotune-no-cudagraphs"), default="none",
                      help="torch.compile(model, mode=...); the warm-up steps include "
                           "compilation (compile_seconds)")
    parser.add_argument("--port", type=int, default=0,
                        help="rendezvous port on 127.0.0.1 when spawning (0: a free one)")
    hosts = parser.add_argument_group(
        "one rank per process (across hosts; all three together, instead of --ranks)")
    hosts.add_argument("--rank", type=int, default=None, help="this process's rank")
    hosts.add_argument("--world-size", type=int, default=None, help="ranks in all")
    hosts.add_argument("--master", default=None, metavar="ADDR:PORT",
                       help="rank 0's address and port for the TCP rendezvous")
    parser.add_argument("--count-only", action="store_true",
                        help="print the parameter count and exit")
    args = parser.parse_args()
    one_rank = (args.rank, args.world_size, args.master)
    if any(value is not None for value in one_rank):
        if any(value is None for value in one_rank):
            parser.error("--rank, --world-size and --master go together")
        if args.world_size < 1 or not 0 <= args.rank < args.world_size:
            parser.error(f"--rank must be in 0..world size - 1, got --rank {args.rank} "
                         f"--world-size {args.world_size}")
        address, _, port = args.master.rpartition(":")
        if not address or not port.isdigit() or not 0 < int(port) < 65536:
            parser.error(f"--master must be ADDR:PORT, got '{args.master}'")
        if args.ranks not in (1, args.world_size):
            parser.error(f"--ranks {args.ranks} contradicts --world-size {args.world_size}")
        args.ranks = args.world_size
    for name in ("ranks", "batch_per_rank", "steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_steps", "profile_steps"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")

    global attention_module
    attention_module = ATTENTION_MODULES[args.attention]
    if args.count_only:
        c = model_config(args)
        model = M3AE(c)
        print_result(args, c, counted_parameters(model))
        return
    require_features(args)
    if args.precision != "fp32" and args.device == "cpu":
        parser.error(f"--precision {args.precision} needs --device cuda (the reference "
                     "autocasts on the GPU only; on the CPU it computes in float32)")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: this PyTorch sees no usable GPU "
                         f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        if args.rank is None and args.ranks > torch.cuda.device_count():
            parser.error(f"--ranks {args.ranks} on --device cuda: one GPU per rank, and "
                         f"{torch.cuda.device_count()} are visible")
    # Every rank one thread, also inside OpenMP regions started before
    # set_num_threads (the spawned processes inherit the environment).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.rank is not None:
        run_rank(args.rank, args, f"tcp://{args.master}")
        return
    if not uses_ddp(args):  # one GPU, no process group: no rendezvous, no spawn
        run_rank(0, args, None)
        return
    mp.spawn(run_rank, args=(args, f"tcp://127.0.0.1:{args.port or free_port()}"),
             nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()

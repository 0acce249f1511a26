#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference for vqa-hpc's training step.

    python3 jobs/ddp_reference.py --preset small --ranks 2 --batch-per-rank 16 \
        --vocab-size V --num-answers K --image-size 96 --question-length L

Trains the same M3AE-style model as `vqa_train --preset P` for a few steps
with PyTorch DDP (gloo backend, CPU) and prints ONE line of JSON on stdout
(rank 0) with the samples per second:

    {"impl": "pytorch-ddp", "ranks": 2, ..., "parameters": N, "samples_per_second": S}

Every size of vqa_train's model can be given (--hidden, --vision-layers, ...,
the names of its `model:` log line); jobs/bench_scaling.sh passes all of them
from that line, so flags given to vqa_train reach this model too.
`--count-only` builds the model, prints the same line without timing
(parameters only) and exits; jobs/bench_scaling.sh uses it to check that this
model and vqa_train's have exactly the same parameter count.

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
    instead, PyTorch's usual module); exact GELU; the same LayerNorm epsilons, the same
    initialisation; the same parameter count (checked by the scaling script);
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
    (it passes vqa_train's warm-up epoch), the steps between two barriers,
    on rank 0.

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
    broadcast_buffers=True, gradient_as_bucket_view=False), unless
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
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# src/model/layers.h: CLIP's LayerNorm epsilon (vision) and BERT's (text, fusion, head).
VISION_LAYER_NORM_EPS = 1e-5
BERT_LAYER_NORM_EPS = 1e-12
# src/model/layers.cpp: the additive score of a padded key.
MASKED_SCORE = -1e4
# src/model/m3ae.h: std of the normal initialisation.
INIT_STD = 0.02
# src/model/config.cpp: RoBERTa's vocabulary, the preset's default.
ROBERTA_VOCAB_SIZE = 50265

# src/model/config.cpp, model_config_preset(). vocab_size, num_answers and
# image_size are overridden by the dataset, as vqa_train does.
PRESETS = {
    "tiny": dict(hidden=64, heads=2, ffn=256, vision_layers=1, text_layers=1, fusion_layers=1,
                 image_size=32, patch_size=8, vocab_size=1024, max_text_length=32,
                 num_answers=10, dropout=0.0),
    "small": dict(hidden=256, heads=4, ffn=1024, vision_layers=4, text_layers=4, fusion_layers=2,
                  image_size=96, patch_size=16, vocab_size=ROBERTA_VOCAB_SIZE,
                  max_text_length=64, num_answers=100, dropout=0.0),
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


ATTENTION_MODULES = {"explicit": MultiHeadAttention, "torch": TorchAttention}
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
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class PreNormBlock(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden, eps=VISION_LAYER_NORM_EPS)
        self.attention = make_attention(hidden, heads, 0.0)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=VISION_LAYER_NORM_EPS)
        self.feed_forward = FeedForward(hidden, ffn)

    def forward(self, x):
        normed = self.attention_norm(x)
        after_attention = x + self.attention(normed, normed, None)
        return after_attention + self.feed_forward(self.feed_forward_norm(after_attention))


class PostNormLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, dropout):
        super().__init__()
        self.attention = make_attention(hidden, heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
        self.feed_forward = FeedForward(hidden, ffn)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, key_bias):
        attended = self.attention_norm(x + self.dropout(self.attention(x, x, key_bias)))
        return self.feed_forward_norm(attended + self.dropout(self.feed_forward(attended)))


class CoAttentionLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, dropout):
        super().__init__()
        self.self_attention = make_attention(hidden, heads, dropout)
        self.self_attention_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
        self.cross_attention = make_attention(hidden, heads, dropout)
        self.cross_attention_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
        self.feed_forward = FeedForward(hidden, ffn)
        self.feed_forward_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
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
    def __init__(self, hidden, heads, ffn, layers, image_size, patch_size):
        super().__init__()
        patches = (image_size // patch_size) ** 2
        self.patch_embedding = nn.Conv2d(3, hidden, patch_size, stride=patch_size, bias=False)
        self.class_token = nn.Parameter(torch.zeros(hidden))
        self.position_embeddings = nn.Parameter(torch.zeros(1 + patches, hidden))
        self.input_norm = nn.LayerNorm(hidden, eps=VISION_LAYER_NORM_EPS)
        self.blocks = nn.ModuleList(PreNormBlock(hidden, heads, ffn) for _ in range(layers))
        self.output_norm = nn.LayerNorm(hidden, eps=VISION_LAYER_NORM_EPS)

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
    def __init__(self, hidden, heads, ffn, layers, vocab_size, max_text_length, dropout):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_text_length, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=BERT_LAYER_NORM_EPS)
        self.embedding_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            PostNormLayer(hidden, heads, ffn, dropout) for _ in range(layers))

    def forward(self, token_ids, key_bias):
        positions = self.position_embeddings.weight[:token_ids.size(1)]
        x = self.embedding_dropout(self.embedding_norm(self.token_embeddings(token_ids) +
                                                       positions))
        for layer in self.layers:
            x = layer(x, key_bias)
        return x


class CoAttentionFusion(nn.Module):
    def __init__(self, hidden, heads, ffn, layers, dropout):
        super().__init__()
        self.text_projection = nn.Linear(hidden, hidden)
        self.image_projection = nn.Linear(hidden, hidden)
        self.modality_type_embeddings = nn.Embedding(2, hidden)
        self.text_layers = nn.ModuleList(
            CoAttentionLayer(hidden, heads, ffn, dropout) for _ in range(layers))
        self.image_layers = nn.ModuleList(
            CoAttentionLayer(hidden, heads, ffn, dropout) for _ in range(layers))

    def forward(self, text, text_key_bias, image):
        type_table = self.modality_type_embeddings.weight
        x = self.text_projection(text) + type_table[0]
        y = self.image_projection(image) + type_table[1]
        for text_layer, image_layer in zip(self.text_layers, self.image_layers):
            x, y = text_layer(x, text_key_bias, y, None), image_layer(y, None, x, text_key_bias)
        return x, y


class VqaHead(nn.Module):
    def __init__(self, hidden, num_answers):
        super().__init__()
        self.text_pooler = nn.Linear(hidden, hidden)
        self.image_pooler = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(2 * hidden, 2 * hidden)
        self.norm = nn.LayerNorm(2 * hidden, eps=BERT_LAYER_NORM_EPS)
        self.output = nn.Linear(2 * hidden, num_answers)

    def forward(self, text, image):
        pooled = torch.cat([torch.tanh(self.text_pooler(text[:, 0])),
                            torch.tanh(self.image_pooler(image[:, 0]))], dim=1)
        return self.output(F.gelu(self.norm(self.dense(pooled))))


class M3AE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.vision = VisionTransformer(c["hidden"], c["heads"], c["ffn"], c["vision_layers"],
                                        c["image_size"], c["patch_size"])
        self.text = TextEncoder(c["hidden"], c["heads"], c["ffn"], c["text_layers"],
                                c["vocab_size"], c["max_text_length"], c["dropout"])
        self.fusion = CoAttentionFusion(c["hidden"], c["heads"], c["ffn"], c["fusion_layers"],
                                        c["dropout"])
        self.head = VqaHead(c["hidden"], c["num_answers"])
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
        text_tokens = self.text(token_ids, text_key_bias)
        fused_text, fused_image = self.fusion(text_tokens, text_key_bias, image_tokens)
        return self.head(fused_text, fused_image)


# The model fields a command-line flag may override, as vqa_train's
# `model:` log line names them (jobs/bench_scaling.sh passes that line's values).
MODEL_FIELDS = ("hidden", "heads", "ffn", "vision_layers", "text_layers", "fusion_layers",
                "image_size", "patch_size", "vocab_size", "max_text_length", "num_answers")


def model_config(args):
    c = dict(PRESETS[args.preset])
    for field in MODEL_FIELDS:
        value = getattr(args, field)
        if value:
            c[field] = value
    if args.dropout is not None:
        c["dropout"] = args.dropout
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
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=args.ranks)
    c = model_config(args)
    torch.manual_seed(args.seed)
    model = M3AE(c)
    parameters = counted_parameters(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb,
                                  find_unused_parameters=args.find_unused_parameters)
    groups, multipliers = parameter_groups(model, args.lr, 0.01, 5.0, 50.0)
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
                                  foreach=args.foreach)
    question_length = args.question_length or c["max_text_length"]
    batches = make_batches(c, args.batch_per_rank, question_length, 4,
                           args.seed * 1000 + rank)

    def step(index):
        images, token_ids, mask, targets = batches[index % len(batches)]
        loss = vqa_loss(ddp(images, token_ids, mask), targets)
        loss.backward()
        # Constant lr here; vqa_train sets each group's lr from its schedule
        # every step, which this mirrors in cost.
        for group, multiplier in zip(optimizer.param_groups, multipliers):
            group["lr"] = args.lr * multiplier
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for index in range(args.warmup_steps):
        step(index)
    dist.barrier()
    start = time.perf_counter()
    for index in range(args.steps):
        step(args.warmup_steps + index)
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        samples = args.ranks * args.batch_per_rank * args.steps
        print_result(args, c, parameters, seconds=seconds, samples=samples,
                     samples_per_second=samples / seconds,
                     step_seconds=seconds / max(1, args.steps))
    dist.destroy_process_group()


def print_result(args, c, parameters, **timing):
    record = {"impl": "pytorch-ddp", "torch": torch.__version__, "backend": "gloo",
              "preset": args.preset, "ranks": args.ranks, "threads_per_rank": args.threads,
              "batch_per_rank": args.batch_per_rank, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "bucket_mb": args.bucket_mb,
              "foreach": bool(args.foreach), "attention": args.attention,
              "find_unused_parameters": bool(args.find_unused_parameters),
              "launcher": "spawn" if args.rank is None else "one rank per process",
              "parameters": parameters, "model": c}
    record.update(timing)
    print(json.dumps(record), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--question-length", type=int, default=0,
                        help="L, tokens per question of the dataset (0: max-text-length)")
    model = parser.add_argument_group(
        "model sizes (0: the preset's; vqa_train takes vocabulary, answers and image size "
        "from the dataset)")
    for field in MODEL_FIELDS:
        model.add_argument("--" + field.replace("_", "-"), type=int, default=0)
    model.add_argument("--dropout", type=float, default=None, help="(default: the preset's)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--batch-per-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--foreach", action="store_true", help="multi-tensor AdamW")
    parser.add_argument("--attention", choices=sorted(ATTENTION_MODULES), default="explicit",
                        help="explicit: matmul / softmax / matmul as vqa_train's; torch: "
                             "nn.MultiheadAttention")
    parser.add_argument("--find-unused-parameters", action="store_true",
                        help="DistributedDataParallel(find_unused_parameters=True)")
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
    if args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")

    global attention_module
    attention_module = ATTENTION_MODULES[args.attention]
    if args.count_only:
        c = model_config(args)
        model = M3AE(c)
        print_result(args, c, counted_parameters(model))
        return
    # Every rank one thread, also inside OpenMP regions started before
    # set_num_threads (the spawned processes inherit the environment).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.rank is not None:
        run_rank(args.rank, args, f"tcp://{args.master}")
        return
    mp.spawn(run_rank, args=(args, f"tcp://127.0.0.1:{args.port or free_port()}"),
             nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""An independent PyTorch reference of M3AE's VQA forward, for the parity test.

Built from torch.nn only, with M3AE's module (and so state_dict) names:
CLIP's visual transformer (nn.MultiheadAttention with its packed
in_proj_weight, QuickGELU, LayerNorm eps 1e-5, 11 blocks in M3AE: CLIP's last
one dropped, ln_post on every token), RoBERTa (eps 1e-5, exact GELU, one
token type, positions padding_idx + running count of real tokens), METER's
BertCrossLayer (eps 1e-12), tanh poolers and vqa_head (LayerNorm eps 1e-5),
with an additive mask of -10000, following M3AE's m3ae_module.infer.

    m3ae_reference.py --dataset D.h5 --checkpoint OUT.ckpt --logits OUT.json [sizes]
    m3ae_reference.py --dataset D.h5 --load-state IN.ckpt --logits OUT.json [sizes]

randomly initialises the model (every parameter, key biases included, away
from its trivial value), saves it as a PyTorch Lightning style checkpoint
(state_dict, hyper_parameters, a callbacks dict keyed by a class of a
stand-in pytorch_lightning package, optimizer_states, and the vision
position table of a smaller pre-training grid, as m3ae.ckpt has), then
resizes that table to the dataset's image size as M3AE's
adapt_position_encoding does and writes the logits of the test split of D.h5
(read with h5py, normalised as the vqa-hpc loader does) as {qid: [K logits]}.

With --load-state it builds M3AE as a VQA fine-tuning does (loss_names
{"vqa": 1}: no MLM, MIM or ITM heads; the position table at the dataset's
image size), loads IN.ckpt ({"state_dict": ...} or a bare state_dict) with
load_state_dict(strict=True) and writes the logits the same way.
"""
import argparse
import collections
import json
import math
import os
import sys
import tempfile

import h5py
import torch
from torch import nn
import torch.nn.functional as F

MASKED = -10000.0


# ---- CLIP's visual transformer (M3AE's clip_model.py) ----------------------
class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(collections.OrderedDict([
            ("c_fc", nn.Linear(width, width * 4)), ("gelu", QuickGELU()),
            ("c_proj", nn.Linear(width * 4, width))]))
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x):  # x: [L, N, D]
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width, blocks, heads):
        super().__init__()
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads) for _ in range(blocks)])

    def forward(self, x):
        return self.resblocks(x)


class VisualTransformer(nn.Module):
    def __init__(self, resolution, patch, width, blocks, heads):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * width ** -0.5)
        self.positional_embedding = nn.Parameter(
            torch.randn((resolution // patch) ** 2 + 1, width) * width ** -0.5)
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = Transformer(width, blocks, heads)
        self.ln_post = nn.LayerNorm(width)

    def forward(self, x):
        x = self.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        t = self.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1])
        x = torch.cat([t, x], dim=1) + self.positional_embedding
        x = self.ln_pre(x)
        x = self.transformer(x.permute(1, 0, 2)).permute(1, 0, 2)
        return self.ln_post(x)


class CLIP(nn.Module):
    """The visual tower and the text-tower leftovers m3ae.ckpt carries."""

    def __init__(self, resolution, patch, width, blocks, heads):
        super().__init__()
        self.visual = VisualTransformer(resolution, patch, width, blocks, heads)
        self.token_embedding = nn.Embedding(49, width)
        self.positional_embedding = nn.Parameter(torch.randn(7, width) * 0.01)
        self.ln_final = nn.LayerNorm(width)

    def forward(self, image):
        return self.visual(image)


# ---- BERT / RoBERTa layers (transformers' names) -----------------------------
class SelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x, mask, context=None, context_mask=None):
        kv = x if context is None else context
        m = mask if context is None else context_mask
        b, lq, h = x.shape
        size = h // self.heads
        split = lambda t: t.view(b, t.shape[1], self.heads, size).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(kv)), split(self.value(kv))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(size) + m
        context_layer = torch.matmul(torch.softmax(scores, dim=-1), v)
        return context_layer.permute(0, 2, 1, 3).reshape(b, lq, h)


class SelfOutput(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, hidden, heads, eps):
        super().__init__()
        setattr(self, "self", SelfAttention(hidden, heads))
        self.output = SelfOutput(hidden, eps)

    def forward(self, x, mask, context=None, context_mask=None):
        return self.output(getattr(self, "self")(x, mask, context, context_mask), x)


class Intermediate(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.dense = nn.Linear(hidden, ffn)

    def forward(self, x):
        return F.gelu(self.dense(x))


class Output(nn.Module):
    def __init__(self, hidden, ffn, eps):
        super().__init__()
        self.dense = nn.Linear(ffn, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Layer(nn.Module):
    def __init__(self, hidden, heads, ffn, eps):
        super().__init__()
        self.attention = Attention(hidden, heads, eps)
        self.intermediate = Intermediate(hidden, ffn)
        self.output = Output(hidden, ffn, eps)

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class CrossLayer(nn.Module):  # METER's BertCrossLayer
    def __init__(self, hidden, heads, ffn, eps):
        super().__init__()
        self.attention = Attention(hidden, heads, eps)
        self.crossattention = Attention(hidden, heads, eps)
        self.intermediate = Intermediate(hidden, ffn)
        self.output = Output(hidden, ffn, eps)

    def forward(self, x, other, mask, other_mask):
        a = self.attention(x, mask)
        c = self.crossattention(a, mask, other, other_mask)
        return self.output(self.intermediate(c), c)


class Embeddings(nn.Module):
    def __init__(self, vocab, hidden, positions, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(1, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-5)
        # As transformers registers it (persistent: it lands in state_dict).
        self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)))

    def forward(self, ids, real):
        # RoBERTa's create_position_ids_from_input_ids, with `real` the
        # tokens that are not padding (ids != pad id of the tokenizer).
        positions = torch.cumsum(real, dim=1) * real + self.padding_idx
        x = self.word_embeddings(ids) + self.token_type_embeddings(torch.zeros_like(ids))
        x = x + self.position_embeddings(positions)
        return self.LayerNorm(x)


class Pooler(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class RobertaModel(nn.Module):
    def __init__(self, vocab, hidden, heads, ffn, layers, positions):
        super().__init__()
        self.embeddings = Embeddings(vocab, hidden, positions)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([Layer(hidden, heads, ffn, 1e-5) for _ in range(layers)])
        self.pooler = Pooler(hidden)


class M3AE(nn.Module):
    def __init__(self, a, pretraining_heads=True):
        super().__init__()
        h = a.hidden
        self.vision_encoder = CLIP(a.pretrain_image_size, a.patch_size, h, a.vision_layers, a.heads)
        self.language_encoder = RobertaModel(a.vocab, h, a.heads, a.ffn, a.text_layers,
                                             a.max_text_length + 2)
        self.multi_modal_language_proj = nn.Linear(h, h)
        self.multi_modal_vision_proj = nn.Linear(h, h)
        self.modality_type_embeddings = nn.Embedding(2, h)
        self.multi_modal_vision_layers = nn.ModuleList(
            [CrossLayer(h, a.heads, a.ffn, 1e-12) for _ in range(a.fusion_layers)])
        self.multi_modal_language_layers = nn.ModuleList(
            [CrossLayer(h, a.heads, a.ffn, 1e-12) for _ in range(a.fusion_layers)])
        self.multi_modal_vision_pooler = Pooler(h)
        self.multi_modal_language_pooler = Pooler(h)
        if pretraining_heads:
            self.mlm_head = nn.Sequential(collections.OrderedDict([("dense", nn.Linear(h, h))]))
            self.itm_head = nn.Sequential(collections.OrderedDict([("fc", nn.Linear(2 * h, 2))]))
            self.mim_head = nn.Sequential(
                collections.OrderedDict([("decoder_embed", nn.Linear(h, 8))]))
        self.vqa_head = nn.Sequential(nn.Linear(2 * h, 2 * h), nn.LayerNorm(2 * h), nn.GELU(),
                                      nn.Linear(2 * h, a.answers))

    def forward(self, image, ids, text_masks):
        extended = lambda m: (1.0 - m[:, None, None, :].float()) * MASKED
        text = self.language_encoder.embeddings(ids, text_masks)
        for layer in self.language_encoder.encoder.layer:
            text = layer(text, extended(text_masks))
        text = self.multi_modal_language_proj(text)
        image = self.multi_modal_vision_proj(self.vision_encoder(image))
        image_masks = torch.ones(image.shape[:2], dtype=torch.long)
        x = text + self.modality_type_embeddings(torch.zeros_like(text_masks))
        y = image + self.modality_type_embeddings(torch.ones_like(image_masks))
        for text_layer, image_layer in zip(self.multi_modal_language_layers,
                                           self.multi_modal_vision_layers):
            x1 = text_layer(x, y, extended(text_masks), extended(image_masks))
            y1 = image_layer(y, x, extended(image_masks), extended(text_masks))
            x, y = x1, y1
        cls = torch.cat([self.multi_modal_language_pooler(x), self.multi_modal_vision_pooler(y)], -1)
        return self.vqa_head(cls)


def randomise(model, seed):
    """Every tensor away from its trivial value, so that each one matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if not value.is_floating_point():
                continue
            noise = torch.randn(value.shape, generator=generator)
            if name.endswith("LayerNorm.weight") or ".ln_" in name and name.endswith("weight") \
                    or name.startswith("vqa_head.1.weight"):
                value.copy_(1.0 + 0.1 * noise)
            else:
                value.copy_(0.05 * noise)


# M3AE's adapt_position_encoding, as in its clip_model.py.
def adapt_position_encoding(table, patch_size, after):
    grid_before = int(math.sqrt(table.shape[0] - 1))
    grid_after = after // patch_size
    dim = table.shape[-1]
    grid = table[1:, :].reshape((grid_before, grid_before, dim)).permute((2, 0, 1)).unsqueeze(0)
    grid = F.interpolate(grid, size=(grid_after, grid_after), mode="bicubic")
    grid = grid.squeeze(0).permute((1, 2, 0)).reshape((-1, dim))
    return torch.cat((table[0:1, :], grid), dim=0)


def save_lightning_checkpoint(model, path, args):
    """The layout of a PyTorch Lightning checkpoint, with a callbacks key that
    is a class of a package the converter will not find."""
    with tempfile.TemporaryDirectory() as stand_in:
        package = os.path.join(stand_in, "pytorch_lightning", "callbacks")
        os.makedirs(package)
        open(os.path.join(stand_in, "pytorch_lightning", "__init__.py"), "w").close()
        open(os.path.join(package, "__init__.py"), "w").close()
        with open(os.path.join(package, "model_checkpoint.py"), "w") as module:
            module.write("class ModelCheckpoint:\n    pass\n")
        sys.path.insert(0, stand_in)
        from pytorch_lightning.callbacks.model_checkpoint import ModelCheckpoint
        checkpoint = {
            "epoch": 99,
            "global_step": 12345,
            "pytorch-lightning_version": "1.5.5",
            "state_dict": collections.OrderedDict(model.state_dict()),
            "callbacks": {ModelCheckpoint: {"best_model_score": torch.tensor(0.5),
                                            "best_model_path": "m3ae.ckpt"}},
            "optimizer_states": [{"state": {0: {"step": 3, "exp_avg": torch.zeros(3)}},
                                  "param_groups": [{"lr": 1e-5, "params": [0]}]}],
            "lr_schedulers": [{"last_epoch": 3}],
            "hyper_parameters": {"config": {"image_size": args.pretrain_image_size,
                                            "vit": "ViT-B/16", "tokenizer": "roberta-base",
                                            "loss_names": {"mlm": 1, "mim": 1, "itm": 1}}},
        }
        torch.save(checkpoint, path)
        sys.path.remove(stand_in)
        for name in [n for n in sys.modules if n.startswith("pytorch_lightning")]:
            del sys.modules[name]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--load-state")
    p.add_argument("--logits", required=True)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--vision-layers", type=int, default=11)
    p.add_argument("--text-layers", type=int, default=12)
    p.add_argument("--fusion-layers", type=int, default=6)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--pretrain-image-size", type=int, default=288)
    p.add_argument("--max-text-length", type=int, default=512)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--questions", type=int, default=0, help="the first N test questions (0: all)")
    a = p.parse_args()
    if (a.checkpoint is None) == (a.load_state is None):
        p.error("give one of --checkpoint and --load-state")
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    with h5py.File(a.dataset, "r") as f:
        a.vocab = f["vocab/tokens"].shape[0]
        a.answers = int(f.attrs["num_answers"])
        image_size = int(f.attrs["image_size"])
        mean = torch.tensor(f.attrs["image_mean"], dtype=torch.float64).float().view(1, 3, 1, 1)
        std = torch.tensor(f.attrs["image_std"], dtype=torch.float64).float().view(1, 3, 1, 1)
        test = f["test"]
        n = test["questions/question_id"].shape[0]
        if a.questions:
            n = min(n, a.questions)
        ids = torch.from_numpy(test["questions/token_ids"][:n]).long()
        masks = torch.from_numpy(test["questions/attention_mask"][:n]).long()
        rows = torch.from_numpy(test["questions/image_row"][:n]).long()
        qids = test["questions/question_id"][:n].tolist()
        pixels = torch.from_numpy(test["images"][:]).index_select(0, rows)
    # As the loader: (pixel / 255 - mean) / std in float32.
    images = (pixels.float() / 255.0 - mean) / std

    torch.manual_seed(a.seed)
    if a.load_state:
        a.pretrain_image_size = image_size
        model = M3AE(a, pretraining_heads=False)
        state = torch.load(a.load_state, map_location="cpu")
        model.load_state_dict(state.get("state_dict", state), strict=True)
    else:
        model = M3AE(a)
        randomise(model, a.seed)
        save_lightning_checkpoint(model, a.checkpoint, a)
        # Fine-tuning at the dataset's image size: M3AE resizes the table at load.
        with torch.no_grad():
            table = model.vision_encoder.visual.positional_embedding
            model.vision_encoder.visual.positional_embedding = nn.Parameter(
                adapt_position_encoding(table.data, a.patch_size, image_size))
    model.eval()
    with torch.no_grad():
        logits = model(images, ids, masks)
    with open(a.logits, "w") as out:
        json.dump({str(q): row for q, row in zip(qids, logits.tolist())}, out)
    print(f"m3ae_reference.py: {sum(t.numel() for t in model.state_dict().values()) / 1e6:.2f}M "
          f"values, {n} test questions, K={a.answers}, vocab {a.vocab}, image {image_size} "
          + (f"(loaded strictly from {a.load_state})" if a.load_state
             else f"(pre-training grid {a.pretrain_image_size})"))


if __name__ == "__main__":
    main()

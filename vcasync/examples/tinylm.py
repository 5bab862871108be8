"""A small transformer language model on text that ships with Python: the standard library's source.

A compute-bound workload: a unit's training (a few dozen steps of a 2-layer transformer over 64-byte
windows) is long next to the model transfer and the merge, which is where asynchronous training on
cheap machines pays. Judged by the mean next-byte cross-entropy over thousands of held-out windows
(:func:`evaluate`), so a 1 % gap is visible, unlike a few hundred test images.

    vcasync coordinator --model vcasync.examples.tinylm:model --unit-param 'lr=0.002' ...
    vcasync worker --trainer vcasync.examples.tinylm:train ...

Data: the ``.py`` files of the running interpreter's standard library (``sysconfig``'s ``stdlib``
path), read as bytes (vocabulary 256), sorted by path, up to ``MAX_BYTES``. Each *file* goes to one
split by a hash of its relative path (80 % train, 10 % validation, 10 % test), so no window of a
validation file was ever trained on. Different Python versions ship different source: compare figures
made with the same interpreter.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

# absolute imports, not relative ones: a user copies this file as a module of their own
from vcasync.errors import ConfigError
from vcasync.tensors import ModelState
from vcasync.trainer import TrainContext, TrainResult

__all__ = ["CONTEXT", "MAX_BYTES", "TinyLM", "evaluate", "load_split", "model", "train", "windows"]

#: Bytes of context the model sees; windows are this long plus one target byte.
CONTEXT = 64
#: At most this much source text is read (sorted by path), to keep start-up quick.
MAX_BYTES = 4_000_000
SPLITS = ("train", "validation", "test")


class TinyLM(nn.Module):
    """Byte embedding + learned positions, ``layers`` causal pre-norm transformer blocks, a tied head."""

    def __init__(self, d_model: int = 64, heads: int = 4, layers: int = 2, context: int = CONTEXT) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # the head is tied: N(0, 1) rows give huge logits
        self.pos = nn.Parameter(torch.zeros(context, d_model))
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        causal = nn.Transformer.generate_square_subsequent_mask(context)
        self.register_buffer("mask", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.pos[:n]
        mask: torch.Tensor = self.mask[:n, :n]  # type: ignore[index]
        h = self.norm(self.blocks(h, mask=mask, is_causal=True))
        out: torch.Tensor = h @ self.embed.weight.T
        return out


def model() -> nn.Module:
    """The example's model (about 105k parameters), seeded by the caller (``--seed``)."""
    return TinyLM()


def _split_of(rel: str) -> str:
    h = int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=4).digest(), "little") % 10
    return "test" if h == 0 else "validation" if h == 1 else "train"


@lru_cache(maxsize=1)
def _corpus() -> dict[str, torch.Tensor]:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    total = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "site-packages" in path.parts or total >= MAX_BYTES:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        parts[_split_of(str(path.relative_to(root)))].append(data)
        total += len(data)
    out = {s: torch.frombuffer(bytearray(b"\n".join(v)), dtype=torch.uint8).long() for s, v in parts.items()}
    if any(len(t) < 10 * (CONTEXT + 1) for t in out.values()):
        raise ConfigError(f"the standard library's source under {root} is too small for the tinylm example")
    return out


def load_split(split: str) -> torch.Tensor:
    """The bytes of one split as int64 token ids."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    return _corpus()[split]


def windows(tokens: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of shape ``[len(starts), CONTEXT]`` at the given start offsets."""
    idx = starts[:, None] + torch.arange(CONTEXT + 1)[None, :]
    w = tokens[idx]
    return w[:, :-1], w[:, 1:]


@lru_cache(maxsize=4)
def _held_out_starts(split: str, count: int) -> torch.Tensor:
    n = len(load_split(split)) - CONTEXT - 1
    return torch.linspace(0, n - 1, count).long()  # evenly spread over the split: thousands of windows


def _num(params: Mapping[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"unit param {name!r} must be a number, got {value!r}")
    return float(value)


def _unit_seed(unit_id: str) -> int:
    root = unit_id.split("~", 1)[0]
    return int.from_bytes(hashlib.blake2b(root.encode(), digest_size=8).digest(), "little") & (2**62 - 1)


def train(ctx: TrainContext) -> TrainResult:
    """``unit.steps`` AdamW steps on random windows of this unit's shard of the training bytes.

    Unit params: ``lr`` (0.002), ``batch_size`` (16), ``checkpoint_every`` (10), ``step_offset``.
    The shard is a contiguous slice, and window offsets come from a seed of the root unit id, so a
    resumed unit or a remainder continues the same sequence.
    """
    unit = ctx.unit
    lr = _num(unit.params, "lr", 0.002)
    batch = int(_num(unit.params, "batch_size", 16))
    every = max(1, int(_num(unit.params, "checkpoint_every", 10)))
    offset = int(_num(unit.params, "step_offset", 0))
    tokens = load_split("train")
    size = len(tokens) // unit.num_shards
    shard = tokens[unit.shard * size:(unit.shard + 1) * size]
    net = model()
    ctx.model.load_into(net)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    start = 0
    ck = ctx.load_checkpoint()
    if ck is not None:
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = int(ck["step"])
    gen = torch.Generator().manual_seed(_unit_seed(unit.unit_id))
    for _ in range(offset + start):
        torch.randint(len(shard) - CONTEXT - 1, (batch,), generator=gen)
    # the last step's loss, kept in the checkpoint: stopped again before a step after a resume, the
    # partial result still reports a finite loss (NaN is refused as a metric)
    loss_value = float(ck.get("loss", "nan")) if ck is not None else float("nan")
    net.train()
    for step in range(start, unit.steps):
        if ctx.should_stop:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                 "loss": loss_value})
            return ctx.result(net, steps=step, samples=step * batch, loss=loss_value)
        x, y = windows(shard, torch.randint(len(shard) - CONTEXT - 1, (batch,), generator=gen))
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        loss_value = float(loss.detach())
        ctx.report_progress(step + 1, (step + 1) * batch, loss=loss_value)
        if (step + 1) % every == 0 and step + 1 < unit.steps:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                                 "loss": loss_value})
    return ctx.result(net, steps=unit.steps, samples=unit.steps * batch, loss=loss_value)


@torch.no_grad()
def evaluate(state: ModelState | Mapping[str, torch.Tensor] | nn.Module, *, split: str = "validation",
             count: int = 4096, batch: int = 512) -> float:
    """Mean next-byte cross-entropy (nats) over ``count`` held-out windows of ``split``."""
    if isinstance(state, nn.Module):
        net = state
    else:
        net = model()
        net.load_state_dict(dict(state.tensors if isinstance(state, ModelState) else state))
    net.eval()
    tokens = load_split(split)
    starts = _held_out_starts(split, count)
    total = 0.0
    for i in range(0, count, batch):
        x, y = windows(tokens, starts[i:i + batch])
        total += float(nn.functional.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1), reduction="sum"))
    loss = total / (count * CONTEXT)
    return loss if math.isfinite(loss) else math.inf

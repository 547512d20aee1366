"""The built-in ``language_model`` task: a small byte-level causal transformer on text that ships with
Python itself.

Corpus: the source of a fixed list of standard-library modules (:data:`CORPUS_FILES`, read in that
order from ``sysconfig.get_paths()["stdlib"]``, joined by a blank line), cut to ``corpus_bytes``
(512 KiB by default; the listed files hold 565,866 bytes under CPython 3.11.7). Nothing is downloaded,
and every rank and run of one installation reads the same bytes; :meth:`LanguageModel.data_fingerprint`
hashes them, so a checkpoint written on another Python's standard library is refused on resume.

Split by position: the first ``1 - val_fraction`` of the bytes train, the rest is held out. Each split
is cut into non-overlapping windows of ``context_length + 1`` bytes; sample ``i`` is window ``i``, an
int64 tensor ``(context_length + 1,)`` (inputs ``[:-1]``, next-byte targets ``[1:]``), a pure
function of ``i``. A batch is ``(N, context_length + 1)``.

Model: a GPT-style decoder written for this task (token and learned position embeddings, pre-norm
blocks of causal multi-head self-attention and a GELU MLP, a final LayerNorm and a linear head over the
256 byte values). Loss: mean next-byte cross-entropy in nats. Metrics: ``loss`` (mean NLL per
predicted byte over the whole held-out split) and ``perplexity = exp(loss)``.

The harness's default optimizer is SGD; a transformer wants AdamW: train it with ``--optimizer adamw
--learning-rate 3e-3`` (docs/task-api.md has the measured run).
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainflow.task import Task

CORPUS_FILES: tuple[str, ...] = (
    "argparse.py", "difflib.py", "enum.py", "dataclasses.py", "collections/__init__.py", "functools.py",
    "calendar.py", "heapq.py", "textwrap.py", "csv.py", "json/encoder.py", "json/decoder.py", "shlex.py",
    "string.py", "glob.py", "fnmatch.py", "bisect.py",
)
"""Standard-library files the corpus is read from, in this order (all present in CPython 3.9-3.13)."""

VOCAB_SIZE = 256  # bytes


def read_corpus(limit: int) -> bytes:
    """The first ``limit`` bytes of :data:`CORPUS_FILES` joined by ``b"\\n\\n"`` (fewer if they hold fewer).

    Raises:
        FileNotFoundError: a listed file is missing from this Python's standard library.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[bytes] = []
    size = 0
    for name in CORPUS_FILES:
        if size >= limit:
            break
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} is missing from this Python's standard library")
        data = path.read_bytes() + b"\n\n"
        parts.append(data)
        size += len(data)
    return b"".join(parts)[:limit]


class Windows(Dataset):
    """Non-overlapping windows of ``length`` tokens over a 1-D uint8 tensor: ``self[i]`` is tokens
    ``[i * length, (i + 1) * length)`` as int64."""

    def __init__(self, tokens: torch.Tensor, length: int) -> None:
        self.tokens = tokens
        self.length = length

    def __len__(self) -> int:
        return len(self.tokens) // self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} is out of range for {len(self)} windows")
        start = i * self.length
        return self.tokens[start:start + self.length].to(torch.int64)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(n, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ByteTransformer(nn.Module):
    """A decoder-only transformer over bytes: ``(N, T)`` int64 tokens → ``(N, T, 256)`` logits of the
    next byte at each position (position ``t`` sees tokens ``0..t`` only)."""

    def __init__(self, *, context_length: int, d_model: int, n_layers: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.context_length = context_length
        self.embed = nn.Embedding(VOCAB_SIZE, d_model)
        self.position = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE)
        for module in self.modules():  # small initial weights (GPT-2's 0.02), from torch's global generator
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.context_length:
            raise ValueError(f"{t} tokens exceed the context length {self.context_length}")
        x = self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LanguageModel(Task):
    """Next-byte prediction on standard-library source with a small causal transformer.

    Args (``task_args``):
        context_length: bytes a window predicts (each sample holds one more), default 64.
        d_model: embedding width, default 64; a multiple of ``n_heads``.
        n_layers: transformer blocks, default 2.
        n_heads: attention heads per block, default 4.
        dropout: dropout probability in attention and the MLP, default 0.0.
        corpus_bytes: bytes of :data:`CORPUS_FILES` to use, default 524288 (512 KiB).
        val_fraction: the held-out tail of the corpus, default 0.1.

    There is no seed argument: the windows are fixed by position, and the initial weights (and
    dropout) come from the job's ``seed``.

    Raises:
        ValueError: an argument out of range (at construction). ``FileNotFoundError`` from the first
            method that reads a corpus file missing from this Python.
    """

    def __init__(self, context_length: int = 64, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                 dropout: float = 0.0, corpus_bytes: int = 524288, val_fraction: float = 0.1) -> None:
        for name, value, low in (("context_length", context_length, 1), ("d_model", d_model, 1),
                                 ("n_layers", n_layers, 1), ("n_heads", n_heads, 1),
                                 ("corpus_bytes", corpus_bytes, 1024)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        if not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not isinstance(val_fraction, int | float) or not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
        self.context_length, self.d_model, self.n_layers, self.n_heads = context_length, d_model, n_layers, n_heads
        self.dropout, self.corpus_bytes, self.val_fraction = float(dropout), corpus_bytes, float(val_fraction)
        self._corpus: bytes | None = None

    # ------------------------------------------------------------------------------ data
    def corpus(self) -> bytes:
        """The corpus bytes (read on first use, then cached)."""
        if self._corpus is None:
            self._corpus = read_corpus(self.corpus_bytes)
        return self._corpus

    def split_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(train, held-out)`` uint8 tensors: the corpus cut at ``1 - val_fraction`` of its length."""
        tokens = torch.frombuffer(bytearray(self.corpus()), dtype=torch.uint8)
        cut = int(len(tokens) * (1 - self.val_fraction))
        return tokens[:cut], tokens[cut:]

    def train_dataset(self) -> Windows:
        return Windows(self.split_tokens()[0], self.context_length + 1)

    def eval_dataset(self) -> Windows:
        return Windows(self.split_tokens()[1], self.context_length + 1)

    def data_fingerprint(self) -> str:
        """``bytes-`` and 16 hex digits of the corpus's SHA-256."""
        return "bytes-" + hashlib.sha256(self.corpus()).hexdigest()[:16]

    # ------------------------------------------------------------------------------ model
    def build_model(self) -> ByteTransformer:
        return ByteTransformer(context_length=self.context_length, d_model=self.d_model, n_layers=self.n_layers,
                               n_heads=self.n_heads, dropout=self.dropout)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) over every position of every window, in float32. All
        windows have the same length, so this is also the mean over the batch's samples."""
        logits = model(batch[:, :-1]).float()
        return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable[torch.Tensor]) -> dict[str, float]:
        """``loss``: mean NLL in nats per predicted byte over the held-out split; ``perplexity``:
        ``exp(loss)`` (both NaN for an empty loader)."""
        nll = 0.0
        count = 0
        for batch in loader:
            logits = model(batch[:, :-1]).float()
            targets = batch[:, 1:]
            nll += float(F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), targets.reshape(-1), reduction="sum"))
            count += targets.numel()
        if not count:
            return {"loss": math.nan, "perplexity": math.nan}
        return {"loss": nll / count, "perplexity": math.exp(nll / count)}

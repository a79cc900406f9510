"""Token batches: synthetic by default, or windows of a binary file of token ids.

Both are map-style datasets of [seq_len] windows, so the DataLoader's workers and pinned
memory (run.dataloader_workers, run.pin_memory) apply to either. Each rank reads its own
windows (index offset by rank), reproducibly from run.seed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from orchestrator.token_file import check_token_file, windows


class SyntheticTokens(Dataset):
    """Uniform random ids: the throughput of a step does not depend on what the tokens say."""

    def __init__(self, vocab: int, seq_len: int, seed: int, length: int = 2**31 - 1):
        self.vocab, self.seq_len, self.seed, self.length = vocab, seq_len, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randint(0, self.vocab, (self.seq_len,), generator=g)


class TokenFile(Dataset):
    """Windows of seq_len ids from a flat binary file (uint16 / uint32), memory-mapped."""

    def __init__(self, path: str, dtype: str, seq_len: int, vocab: int, seed: int):
        check_token_file(path, dtype, seq_len, vocab)  # again on the rank's host: on SLURM it is first seen here
        self.tokens: np.ndarray = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.seq_len, self.vocab, self.seed = seq_len, vocab, seed

    def __len__(self) -> int:
        return 2**31 - 1  # windows are drawn at random positions, endlessly

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng(self.seed * 1_000_003 + index)
        start = int(rng.integers(0, windows(len(self.tokens), self.seq_len)))
        return torch.from_numpy(self.tokens[start : start + self.seq_len].astype(np.int64))


class RankSampler(torch.utils.data.Sampler):
    """rank, rank + world, rank + 2 world, ...: disjoint windows per rank, from the start-th on."""

    def __init__(self, rank: int, world: int, start: int = 0):
        self.rank, self.world, self.start = rank, world, start

    def __iter__(self):
        i = self.rank + self.start * self.world
        while True:
            yield i
            i += self.world


def batches(spec, rank: int, world: int, consumed: int = 0) -> DataLoader:
    """consumed: micro batches this rank has already trained on (a resumed trial goes on from there)."""
    m, run = spec.cfg.model, spec.cfg.run
    if run.data:
        dataset: Dataset = TokenFile(run.data, run.data_dtype, m.seq_len, m.vocab, run.seed)
    else:
        dataset = SyntheticTokens(m.vocab, m.seq_len, run.seed)
    sampler = RankSampler(rank, world, start=consumed * spec.micro_batch_size)
    return DataLoader(
        dataset,
        batch_size=spec.micro_batch_size,
        sampler=sampler,
        num_workers=run.dataloader_workers,
        pin_memory=run.pin_memory,
        persistent_workers=run.dataloader_workers > 0,
    )

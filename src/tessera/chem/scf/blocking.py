"""Shell blocks: the tiles of the distributed Fock build.

Shells are grouped into blocks of consecutive shells (whole atoms where possible, so a
block is spatially compact and its Schwarz bounds are tight), as in GTFock (Liu, Patel,
Chow, "Parallel scalable Hartree-Fock", IPDPS 2014, Sec. III-A: shells are reordered so
that nearby shells are adjacent, then grouped).  A block is a contiguous shell range, hence
a contiguous AO range, so one libcint call with ``shls_slice`` covers a block quartet.
The AO tiling of the density and Fock GlobalArrays is the list of block sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera.errors import InputError

#: Largest default block, in basis functions.  A task is a quartet of blocks, so a task
#: holds up to ``MAX_DEFAULT_BLOCK_NBF**4`` integrals (8 MB at 32).
MAX_DEFAULT_BLOCK_NBF = 32


@dataclass(frozen=True)
class ShellBlocks:
    """Blocks of consecutive shells.

    ``shell_ranges[b] = (s0, s1)`` are the shells of block ``b``, ``ao_ranges[b] = (a0, a1)``
    its basis functions; ``ao_loc`` is PySCF's shell offset table (``nbas + 1`` entries).
    """

    shell_ranges: tuple
    ao_ranges: tuple
    ao_loc: np.ndarray

    @property
    def nblocks(self) -> int:
        return len(self.shell_ranges)

    @property
    def sizes(self) -> list:
        return [a1 - a0 for a0, a1 in self.ao_ranges]

    @property
    def nao(self) -> int:
        return int(self.ao_loc[-1])

    def ao_slice(self, b: int) -> slice:
        a0, a1 = self.ao_ranges[b]
        return slice(a0, a1)

    def shell_sizes(self, b: int) -> np.ndarray:
        """Number of functions of each shell of block ``b``."""
        s0, s1 = self.shell_ranges[b]
        return np.diff(self.ao_loc[s0:s1 + 1])


def default_block_nbf(nao: int) -> int:
    """Block size target: about 6 blocks per dimension (a few hundred tasks, enough to
    balance a few ranks), at most MAX_DEFAULT_BLOCK_NBF functions."""
    return max(1, min(MAX_DEFAULT_BLOCK_NBF, math.ceil(nao / 6)))


def make_blocks(mol, block_nbf: int | None = None) -> ShellBlocks:
    """Group the shells of a built ``pyscf.gto.Mole`` into blocks of about ``block_nbf``
    functions.

    Whole atoms are packed greedily while they fit; an atom larger than the target is split
    at shell boundaries.  A single shell larger than the target forms its own block.
    """
    ao_loc = np.asarray(mol.ao_loc_nr(), dtype=np.int64)
    nbas = mol.nbas
    if nbas == 0:
        raise InputError("the molecule has no basis functions; expected a built "
                         "pyscf.gto.Mole with a basis set")
    if block_nbf is None:
        block_nbf = default_block_nbf(int(ao_loc[-1]))
    if int(block_nbf) < 1:
        raise InputError(f"block_nbf={block_nbf!r}: expected a positive number of basis "
                         "functions per shell block")
    target = int(block_nbf)

    # Shell ranges per atom, in shell order (PySCF orders shells by atom).
    atom_ranges = []
    for row in mol.aoslice_by_atom():
        s0, s1 = int(row[0]), int(row[1])
        if s1 > s0:
            atom_ranges.append((s0, s1))
    atom_ranges.sort()

    def nbf(s0, s1):
        return int(ao_loc[s1] - ao_loc[s0])

    blocks = []
    cur = None                       # (s0, s1) of the block being filled
    for s0, s1 in atom_ranges:
        if cur is not None and cur[1] == s0 and nbf(cur[0], s1) <= target:
            cur = (cur[0], s1)       # the whole atom fits
            continue
        if cur is not None:
            blocks.append(cur)
            cur = None
        if nbf(s0, s1) <= target:
            cur = (s0, s1)
            continue
        # Split a large atom at shell boundaries.
        start = s0
        for s in range(s0 + 1, s1):
            if nbf(start, s + 1) > target:
                blocks.append((start, s))
                start = s
        cur = (start, s1)
    if cur is not None:
        blocks.append(cur)

    covered = [s for b in blocks for s in range(*b)]
    if covered != list(range(nbas)):
        raise InputError("internal error: shell blocks do not cover the shells in order; "
                         "report this with the molecule")
    ao_ranges = tuple((int(ao_loc[s0]), int(ao_loc[s1])) for s0, s1 in blocks)
    return ShellBlocks(shell_ranges=tuple(blocks), ao_ranges=ao_ranges, ao_loc=ao_loc)

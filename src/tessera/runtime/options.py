"""Runtime options: progress mode, ghost ranks, window memory, emulated nodes; from
arguments or environment.

Explicit arguments win over environment variables; anything unknown is an error.

    TESSERA_PROGRESS      = auto | none | thread | ghost   (default auto: ghost when the ranks
                            span more than one node, else none; decided when the World starts)
    TESSERA_GHOSTS        = N >= 1     ghost ranks per node (ghost or auto; default 1)
    TESSERA_WINDOW        = allocate | create   memory behind the RMA windows (none/thread)
    TESSERA_EMULATE_NODES = N >= 1     treat the ranks as N nodes (consecutive ranks share
                            one): no shared memory between ranks of different emulated
                            nodes (for tests of multi-node paths on one machine)
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Mapping

from tessera.errors import RuntimeLayerError

PROGRESS_MODES = ("auto", "none", "thread", "ghost")
WINDOW_KINDS = ("allocate", "create")

ENV_PROGRESS = "TESSERA_PROGRESS"
ENV_GHOSTS = "TESSERA_GHOSTS"
ENV_WINDOW = "TESSERA_WINDOW"
ENV_EMULATE_NODES = "TESSERA_EMULATE_NODES"


@dataclass(frozen=True)
class RuntimeOptions:
    """Resolved options of one World.

    progress: "auto" (until the World starts: "ghost" when the ranks span more than one
        node and no window kind was asked for, else "none"), "none" (MPI progresses only inside MPI calls), "thread" (a helper thread
        per rank blocks inside MPI and so drives progress while the rank computes), or
        "ghost" (`ghosts` ranks per node hold no work and serve the node's data).
    ghosts: ghost ranks per node (0 unless progress == "ghost").
    window: "allocate" (MPI_Win_allocate: MPICH serves same-node RMA directly from shared
        memory), "create" (MPI_Win_create over MPI_Alloc_mem memory: every RMA goes
        through the target's progress engine, as it does between nodes), or "shared"
        (ghost mode: node shared memory exposed by the ghost ranks).
    emulate_nodes: 0 (the real nodes) or N: the ranks are treated as N nodes.
    abort_on_error: an uncaught exception on any rank calls MPI_Abort, so the other
        ranks do not hang in a collective (only when more than one rank runs).
    """

    progress: str = "none"
    ghosts: int = 0
    window: str = "allocate"
    abort_on_error: bool = True
    emulate_nodes: int = 0

    @classmethod
    def resolve(
        cls,
        progress: str | None = None,
        ghosts: int | None = None,
        window: str | None = None,
        abort_on_error: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> "RuntimeOptions":
        env = os.environ if environ is None else environ
        source_p = "progress argument"
        if progress is None:
            progress = env.get(ENV_PROGRESS) or "auto"
            source_p = ENV_PROGRESS
        progress = str(progress).strip().lower()
        if progress not in PROGRESS_MODES:
            raise RuntimeLayerError(
                f"unknown progress mode {progress!r} (from {source_p}); expected one of "
                f"{', '.join(PROGRESS_MODES)}. Set {ENV_PROGRESS}=auto|none|thread|ghost."
            )

        source_g = "ghosts argument"
        if ghosts is None and env.get(ENV_GHOSTS):
            ghosts = env[ENV_GHOSTS]
            source_g = ENV_GHOSTS
        if ghosts is not None:
            try:
                ghosts = int(ghosts)
            except (TypeError, ValueError):
                raise RuntimeLayerError(
                    f"ghost count {ghosts!r} (from {source_g}) is not an integer; expected "
                    f"a whole number >= 1, e.g. {ENV_GHOSTS}=1."
                ) from None
            if progress not in ("ghost", "auto"):
                raise RuntimeLayerError(
                    f"a ghost count was given ({source_g}={ghosts}) but the progress mode is "
                    f"{progress!r}; ghost ranks exist only with progress 'ghost'. Set "
                    f"{ENV_PROGRESS}=ghost (or auto) or drop {ENV_GHOSTS}."
                )
            if ghosts < 1:
                raise RuntimeLayerError(
                    f"ghost count {ghosts} (from {source_g}) must be >= 1 in ghost mode; "
                    "use progress 'none' for no ghost ranks."
                )
            if progress == "auto":
                progress = "ghost"          # ghost ranks asked for: ghost progress
        elif progress == "ghost":
            ghosts = 1
        else:
            ghosts = 0

        source_w = "window argument"
        if window is None:
            window = env.get(ENV_WINDOW) or None
            source_w = ENV_WINDOW
        if progress == "ghost":
            if window is not None:
                raise RuntimeLayerError(
                    f"window kind {window!r} (from {source_w}) cannot be chosen in ghost mode: "
                    "there the node's data always lives in MPI shared memory exposed by the "
                    f"ghost ranks. Unset {ENV_WINDOW} or use progress none/thread."
                )
            window = "shared"
        else:
            if progress == "auto" and window is not None:
                progress = "none"           # a window kind asked for: no ghost ranks
            window = str(window or "allocate").strip().lower()
            if window not in WINDOW_KINDS:
                raise RuntimeLayerError(
                    f"unknown window kind {window!r} (from {source_w}); expected one of "
                    f"{', '.join(WINDOW_KINDS)}."
                )
        raw = env.get(ENV_EMULATE_NODES)
        emulate = 0
        if raw is not None and raw.strip():
            try:
                emulate = int(raw)
            except ValueError:
                emulate = 0
            if emulate < 1:
                raise RuntimeLayerError(
                    f"{ENV_EMULATE_NODES}={raw!r}: expected a whole number >= 1 (the nodes to "
                    "treat the ranks as); fix or unset it."
                )
        return cls(progress=progress, ghosts=ghosts, window=window,
                   abort_on_error=bool(abort_on_error), emulate_nodes=emulate)

    def on_nodes(self, nnodes: int, fits_ghost: bool) -> "RuntimeOptions":
        """The options once the World knows its nodes: progress "auto" becomes "ghost" (one
        ghost per node) when the ranks span more than one node and every node has a rank
        left to work, else "none"."""
        if self.progress != "auto":
            return self
        if nnodes > 1 and fits_ghost:
            return replace(self, progress="ghost", ghosts=1, window="shared")
        return replace(self, progress="none", ghosts=0)

    def to_dict(self) -> dict:
        return asdict(self)

"""Runtime options: progress mode, ghost ranks, window memory; from arguments or environment.

Explicit arguments win over environment variables; anything unknown is an error.

    TESSERA_PROGRESS = none | thread | ghost     (default none)
    TESSERA_GHOSTS   = N >= 1                    ghost ranks per node (ghost mode only; default 1)
    TESSERA_WINDOW   = allocate | create         memory behind the RMA windows (none/thread only)
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Mapping

from tessera.errors import RuntimeLayerError

PROGRESS_MODES = ("none", "thread", "ghost")
WINDOW_KINDS = ("allocate", "create")

ENV_PROGRESS = "TESSERA_PROGRESS"
ENV_GHOSTS = "TESSERA_GHOSTS"
ENV_WINDOW = "TESSERA_WINDOW"


@dataclass(frozen=True)
class RuntimeOptions:
    """Resolved options of one World.

    progress: "none" (MPI progresses only inside MPI calls), "thread" (a helper thread
        per rank blocks inside MPI and so drives progress while the rank computes), or
        "ghost" (`ghosts` ranks per node hold no work and serve the node's data).
    ghosts: ghost ranks per node (0 unless progress == "ghost").
    window: "allocate" (MPI_Win_allocate: MPICH serves same-node RMA directly from shared
        memory), "create" (MPI_Win_create over MPI_Alloc_mem memory: every RMA goes
        through the target's progress engine, as it does between nodes), or "shared"
        (ghost mode: node shared memory exposed by the ghost ranks).
    abort_on_error: an uncaught exception on any rank calls MPI_Abort, so the other
        ranks do not hang in a collective (only when more than one rank runs).
    """

    progress: str = "none"
    ghosts: int = 0
    window: str = "allocate"
    abort_on_error: bool = True

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
            progress = env.get(ENV_PROGRESS) or "none"
            source_p = ENV_PROGRESS
        progress = str(progress).strip().lower()
        if progress not in PROGRESS_MODES:
            raise RuntimeLayerError(
                f"unknown progress mode {progress!r} (from {source_p}); expected one of "
                f"{', '.join(PROGRESS_MODES)}. Set {ENV_PROGRESS}=none|thread|ghost."
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
            if progress != "ghost":
                raise RuntimeLayerError(
                    f"a ghost count was given ({source_g}={ghosts}) but the progress mode is "
                    f"{progress!r}; ghost ranks exist only with progress 'ghost'. Set "
                    f"{ENV_PROGRESS}=ghost or drop {ENV_GHOSTS}."
                )
            if ghosts < 1:
                raise RuntimeLayerError(
                    f"ghost count {ghosts} (from {source_g}) must be >= 1 in ghost mode; "
                    "use progress 'none' for no ghost ranks."
                )
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
            window = str(window or "allocate").strip().lower()
            if window not in WINDOW_KINDS:
                raise RuntimeLayerError(
                    f"unknown window kind {window!r} (from {source_w}); expected one of "
                    f"{', '.join(WINDOW_KINDS)}."
                )
        return cls(progress=progress, ghosts=ghosts, window=window,
                   abort_on_error=bool(abort_on_error))

    def to_dict(self) -> dict:
        return asdict(self)

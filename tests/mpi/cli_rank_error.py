"""A TesseraError raised on one rank only, inside ``tessera run``, must end every rank.

The run's job is replaced (by argument ``which``) with one that starts MPI and raises
an InputError on rank 1 (``one``) or on every rank (``all``) while the others wait in a
barrier. The CLI must print the error once and end the run with exit status 2 instead
of leaving the other ranks waiting.
"""

import sys

import tessera.cli.main as cli
from tessera.errors import InputError
from tessera.runtime import World


def failing_run(which):
    def run(args, state):
        world = World.get()
        if which == "all" or world.rank == 1:
            raise InputError(f"deliberate failure on rank {world.rank}")
        world.barrier()
        print('{"passed_barrier": true}', flush=True)
        return 0
    return run


if __name__ == "__main__":
    cli._run = failing_run(sys.argv[1])
    sys.exit(cli.main(["run", "unused.xyz"]))

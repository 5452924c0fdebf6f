"""An uncaught exception on one rank must end the whole run, not hang the others.

Rank 1 raises right after start-up while the other ranks wait in a barrier; the World's
excepthook calls MPI_Abort, so mpiexec exits with a non-zero status at once. Prints
nothing on success of the others (they never get past the barrier).
"""

from tessera.runtime import World


def main():
    world = World.get()
    if world.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    world.barrier()
    print('{"passed_barrier": true}', flush=True)


if __name__ == "__main__":
    main()

"""Closed-shell (spin-adapted) CCSD amplitude equations, written once as expressions.

The arrangement is PySCF's ``cc/ccsd.py`` (``update_amps`` with ``_add_ovvv_``), the
lean form of the closed-shell equations of Scuseria, Janssen and Schaefer, J. Chem.
Phys. 89, 7382 (1988) (chemists' integrals (pq|rs)), for canonical RHF orbitals (f_ia =
0, diagonal f_ij and f_ab moved into the denominators). The T2 residual is built as Z
and enters as R2 = Z_ijab + Z_jiba, so terms symmetric in (ia)<->(jb) carry 1/2 and each
asymmetric term is computed once; the particle-hole ring takes four o^3 v^3
contractions (two W intermediates, built with combined amplitudes, each applied once).
The ovvv tau t1 term of ``_add_ovvv_`` and its (ia)<->(jb) twin are the t1 dressing of
the ladder, W_acbd = (ac|bd) - t_ka (kc|bd) - t_kb (ac|kd) (the t1-dressed ladder, e.g.
Koch, Christiansen, Kobayashi, Jorgensen, Helgaker, Chem. Phys. Lett. 224, 263 (1994)),
written once in ``ladder``. A product two updates share is made
once and reused: Wt1_ovov[iajb] = (ia|bc) t_jc - (ia|jk) t_kb enters W2 and Z (as PySCF's
``_add_ovvv_`` reads each ovvv slice once for all its t1 products), and Wt1_ovoo[iajk]
= (kj|ac) t_ic + (ia|kc) t_jc takes Z's two t1 t1 terms to one product with t_kb: the
skinny GEMMs with t1 read all of their integrals for few flops, and each term of Z is
a pass over it. The ladder and the Woooo terms are symmetric and go to R2 directly;
the planner runs them on the pairs i <= j
(``plan.symmetric.symmetric_half``), and the ladder, with vvvv frozen and local, also in the
symmetric/antisymmetric form over the virtual pairs (``plan.symmetric._plus_minus_steps``,
Scuseria, Janssen, Schaefer 1988), its t1 dressing applied to the packed tau+- (o^3 v^3,
no v^4 operand per iteration). Per iteration about o^2 v^4 / 2 + 9 o^3 v^3 + 2 o^4 v^2
flops in C1 (o^2 v^4 + 10 o^3 v^3 + 2 o^4 v^2 on the MPI backends, which run the ladder
on the pairs i <= j only and its dressing as (ovvv tau) t1 on every i, j, once, added with
its mirror image): glycine cc-pVDZ (o = 20, v = 75) 4.15e10 flops on the local backends,
1.03x the minimal count o^2 v^4 + 8 o^3 v^3 + o^4 v^2 (``ccsd.minimal_flops``).
Letters: i j k l occupied, a b c d virtual. Each term carries its cost.
"""

from __future__ import annotations

import tessera as ts
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry

T2_SYMMETRY = (PermutationalSymmetry((1, 0, 3, 2)),)


def new(ints, letters: str, name: str, symmetry=None) -> BlockTensor:
    """A zero tensor over ``letters``; oovv tensors are declared pair-symmetric (X[ijab] =
    X[jiba]) unless ``symmetry`` says otherwise. A pair-symmetric tensor stores its
    canonical blocks only (about half of them: T2, tau, the residual R2, ...); the
    planner writes only those, and proves each update into it symmetric. Tensors of
    T2's size (two occupied and two virtual indices) are placed in ``pieces``: where
    they have too few blocks for the ranks, mpi-onesided cuts their blocks
    (``runtime.placement.block_placement`` decides)."""
    if symmetry is None:
        symmetry = T2_SYMMETRY if letters == "oovv" else ()
    return BlockTensor(ints.spaces(letters), 0, name=name, symmetry=symmetry, canonical=symmetry == T2_SYMMETRY,
                       placement=amplitude_placement(letters))


def amplitude_placement(letters: str) -> str:
    """The placement of a CCSD tensor over ``letters``: ``pieces`` for T2-sized ones."""
    return "pieces" if sorted(letters) == sorted("oovv") else "balanced"


def make_tau(ints, t1, t2):
    """tau_ijab = t_ijab + t_ia t_jb."""
    tau = new(ints, "oovv", "tau")
    with ts.equations():
        tau["ijab"] = t2["ijab"] + t1["ia"] * t1["jb"]                  # o2v2
    return tau


def fixed_intermediates(ints) -> dict:
    """The intermediates made of integrals alone, once per CCSD (frozen: executors keep
    their gathered matrices like the integrals'): ``L`` for the energy, in T2's layout
    (pair-symmetric like T2), and ``VO`` for W2."""
    L, VO = new(ints, "oovv", "L"), new(ints, "voov", "VO")
    with ts.equations():
        L["ijab"] = 2.0 * ints.ovov["iajb"] - ints.ovov["ibja"]         # o2v2
        VO["aikc"] = ints.ovov["iakc"] - 0.5 * ints.ovov["kaic"]        # o2v2
    return {"L": L.freeze(), "VO": VO.freeze()}


def correlation_energy(L, tau) -> float:
    """E = sum_ijab (ia|jb) (2 tau_ijab - tau_ijba) = sum_ijab L_ijab tau_ijab (swap a, b
    in the second sum; ``L`` of ``fixed_intermediates``): one dot of two tensors of the
    same layout, no transposes."""
    return ts.dot(L["ijab"], tau["ijab"])


def ladder(ints, r2, tau, t1) -> None:
    """R2_ijab += W_acbd tau_ijcd, the t1-dressed particle-particle ladder (inside
    ``ts.equations()``), W_acbd = (ac|bd) - t_ka (kc|bd) - t_kb (ac|kd): the only term
    that reads vvvv, and the ovvv tau t1 term of PySCF's ``_add_ovvv_`` with its (ia)<->(jb)
    twin. The planner runs it in the +/- form with the dressing applied to the packed
    amplitudes where it can (local runs), else as the ladder plus the dressing computed
    once and added with its mirror image (``plan.symmetric.dressed_ladder``)."""
    r2["ijab"] += (ints.vvvv["acbd"] - ints.ovvv["kcbd"] * t1["ka"]                     # o2v4 / 4
                   - ints.ovvv["kdac"] * t1["kb"]) * tau["ijcd"]                       # o3v3 (local), 2 o3v3


def residual(ints, t1, t2, tau=None, fixed=None):
    """Right-hand sides (without the orbital-energy diagonal) of the T1 and T2 equations;
    ``tau``: ``make_tau(ints, t1, t2)`` and ``fixed``: ``fixed_intermediates(ints)``, when
    the caller has them already."""
    I = ints  # noqa: E741  (integral classes: I.ovov[iajb] = (ia|jb), ...)
    tau = make_tau(ints, t1, t2) if tau is None else tau
    u = new(I, "oovv", "u")
    taup, taupp = new(I, "oovv", "taup"), new(I, "ovov", "taupp")
    Fov, fvv, foo = new(I, "ov", "Fov"), new(I, "vv", "fvv"), new(I, "oo", "foo")
    ftv, fto = new(I, "vv", "ftv"), new(I, "oo", "fto")
    Woooo = new(I, "oooo", "Woooo", T2_SYMMETRY)                  # Woooo[ijkl] = Woooo[jilk]
    X0, X = new(I, "voov", "X0"), new(I, "voov", "X")
    VO = (fixed or fixed_intermediates(ints))["VO"]
    Wt1_ovov, Wt1_ovoo = new(I, "ovov", "Wt1_ovov"), new(I, "ovoo", "Wt1_ovoo")
    W2, Y = new(I, "voov", "W2"), new(I, "ovov", "Y")
    r1, r2, Z = new(I, "ov", "R1"), new(I, "oovv", "R2"), new(I, "oovv", "Z", symmetry=())

    # in groups, each intermediate freed after the last group that reads it, so that
    # fewer are held at once (glycine cc-pVDZ: ov x ov arrays of 17 MiB each)
    with ts.equations():
        u["ijab"] = 2.0 * t2["ijab"] - t2["ijba"]                       # combined amplitudes, o2v2

        # one-body intermediates (PySCF fov, fvv, foo; ft_ab, ft_ij). PySCF contracts
        # theta = 2 tau~ - tau~[ijba] (tau~ = t2 + t1 t1 / 2) = u + t_ia t_jb - t_ib t_ja / 2
        # with (ia|jb) in fvv and foo; its t1 t1 part sums to t1 times Fov (Fov_kc =
        # 2 (kc|ld) t_ld - (kd|lc) t_ld): sum_jic (t_jc t_ia - t_ja t_ic / 2) (jc|ib) =
        # sum_i t_ia Fov_ib / 2, so u is contracted instead and no theta is made (three
        # o2v2 passes fewer)
        Fov["kc"] += 2.0 * I.ovov["kcld"] * t1["ld"] - I.ovov["kdlc"] * t1["ld"]          # o2v2
        fvv["ab"] += (2.0 * I.ovvv["kcab"] * t1["kc"] - I.ovvv["kbca"] * t1["kc"]          # ov3
                      - u["jica"] * I.ovov["jcib"] - 0.5 * t1["ia"] * Fov["ib"])          # o2v3
        foo["ij"] += (2.0 * I.ovoo["kcji"] * t1["kc"] - I.ovoo["icjk"] * t1["kc"]          # o3v
                      + I.ovov["iakb"] * u["jkab"] + 0.5 * t1["ja"] * Fov["ia"])          # o3v2
        ftv["ab"] += fvv["ab"] - 0.5 * t1["ia"] * Fov["ib"]
        fto["ij"] += foo["ij"] + 0.5 * t1["ja"] * Fov["ia"]

    # two-body intermediates
    with ts.equations():
        taup["jkca"] = 0.5 * t2["jkca"] + t1["jc"] * t1["ka"]                            # o2v2
        X0["bija"] += -I.ovvv["icba"] * t1["jc"] + I.ovoo["kbij"] * t1["ka"] - I.oovv["ijba"]  # o2v3
        X["bija"] += X0["bija"] + I.ovov["kbic"] * taup["jkca"]                          # o3v3
    del taup
    with ts.equations():
        taupp["kcjb"] = u["jkbc"] - 2.0 * t1["kb"] * t1["jc"]    # 2 t2[jkbc] - t2[kjbc] - 2 t1 t1
        Wt1_ovov["iajb"] += I.ovvv["iabc"] * t1["jc"] - I.ovoo["iajk"] * t1["kb"]        # o2v3
        W2["aijb"] += (Wt1_ovov["iajb"] + 0.5 * X0["aijb"] + I.ovov["iajb"]
                       + 0.5 * VO["aikc"] * taupp["kcjb"])                                # o3v3
    del taupp, X0
    with ts.equations():
        Wt1_ovoo["iajk"] += I.oovv["kjac"] * t1["ic"] + I.ovov["iakc"] * t1["jc"]        # o3v2
        Y["jaib"] += t2["jkca"] * X["ckib"]                                               # o3v3
    del X

    with ts.equations():
        r1["ia"] += (-I.oovv["jiab"] * t1["jb"] + 2.0 * I.ovov["iajb"] * t1["jb"]
                     + I.ovvv["jcba"] * u["ijbc"]                                         # o2v3
                     + Fov["jb"] * u["ijab"] - I.ovoo["jbki"] * u["kjab"]                 # o3v2
                     + fvv["ab"] * t1["ib"] - foo["ji"] * t1["ja"])
        Z["ijab"] += (Wt1_ovov["iajb"]
                      - Wt1_ovoo["iajk"] * t1["kb"]                                       # o3v2
                      + Y["jaib"] + 0.5 * Y["iajb"]
                      + u["kica"] * W2["ckjb"]                                            # o3v3
                      + t2["ijac"] * ftv["bc"] - fto["ki"] * t2["kjab"])                  # o2v3, o3v2
        # (ia|jb), symmetric, straight to R2's canonical half (not its half to Z, then Z
        # and Z[jiba] to R2: one pass over half of R2 for three over Z)
        r2["ijab"] += I.ovov["iajb"] + Z["ijab"] + Z["jiba"]
    del u, Wt1_ovov, Wt1_ovoo, W2, Y, Z

    with ts.equations():
        # symmetric in (ia)<->(jb): straight to R2, computed on the pairs i <= j (planner)
        Woooo["ijkl"] += (I.oooo["ikjl"] + I.ovoo["kalj"] * t1["ia"] + I.ovoo["laki"] * t1["ja"]  # o4v
                          + I.ovov["kalb"] * tau["ijab"])                                 # o4v2 / 2
        ladder(I, r2, tau, t1)                                                            # o2v4 / 4 + o3v3
        r2["ijab"] += Woooo["ijkl"] * tau["klab"]                                         # o4v2 / 2
    return r1, r2

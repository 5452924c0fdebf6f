"""Closed-shell (spin-adapted) CCSD amplitude equations, written once as expressions.

Terms follow Hirata et al., J. Chem. Phys. 120, 2581 (2004), Eqs. (35)-(36), in the
arrangement of PySCF's ``rccsd``/``rintermediates`` (chemists' integrals (pq|rs)), for
canonical RHF orbitals (f_ia = 0, diagonal f_ij and f_ab moved into the denominators).
Letters: i j k l occupied, a b c d virtual. Each term carries its cost.
"""

from __future__ import annotations

import tessera as ts
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry

T2_SYMMETRY = (PermutationalSymmetry((1, 0, 3, 2)),)


def new(ints, letters: str, name: str) -> BlockTensor:
    sym = T2_SYMMETRY if letters == "oovv" else ()
    return BlockTensor(ints.spaces(letters), 0, name=name, symmetry=sym)


def make_tau(ints, t1, t2):
    """tau_ijab = t_ijab + t_ia t_jb;  theta_ijab = 2 tau_ijab - tau_ijba."""
    tau, theta = new(ints, "oovv", "tau"), new(ints, "oovv", "theta")
    with ts.equations():
        tau["ijab"] = t2["ijab"] + t1["ia"] * t1["jb"]                  # o2v2
        theta["ijab"] = 2.0 * tau["ijab"] - tau["ijba"]                 # o2v2
    return tau, theta


def correlation_energy(ints, t1, t2) -> float:
    """E = sum_ijab (ia|jb) (2 tau_ijab - tau_ijba)."""
    _, theta = make_tau(ints, t1, t2)
    return ts.dot(ints.ovov["iajb"], theta["ijab"])


def residual(ints, t1, t2):
    """Right-hand sides (without the orbital-energy diagonal) of the T1 and T2 equations."""
    I = ints  # noqa: E741  (integral classes: I.ovov[iajb] = (ia|jb), ...)
    tau, theta = make_tau(ints, t1, t2)
    Foo, Fvv, Fov = new(I, "oo", "Foo"), new(I, "vv", "Fvv"), new(I, "ov", "Fov")
    Loo, Lvv = new(I, "oo", "Loo"), new(I, "vv", "Lvv")
    Woooo = new(I, "oooo", "Woooo")
    Wvoov, Wvovo = new(I, "voov", "Wvoov"), new(I, "vovo", "Wvovo")
    r1, r2, Z = new(I, "ov", "R1"), new(I, "oovv", "R2"), new(I, "oovv", "Z")

    with ts.equations():
        # one-body intermediates (Hirata Eq. 36; PySCF cc_Foo, cc_Fvv, cc_Fov, Loo, Lvv)
        Foo["ki"] += I.ovov["kcld"] * theta["ilcd"]                     # o3v2
        Fvv["ac"] -= I.ovov["kcld"] * theta["klad"]                     # o2v3
        Fov["kc"] += 2.0 * I.ovov["kcld"] * t1["ld"] - I.ovov["kdlc"] * t1["ld"]   # o2v2
        Loo["ki"] += Foo["ki"] + 2.0 * I.ovoo["lcki"] * t1["lc"] - I.ovoo["kcli"] * t1["lc"]  # o3v
        Lvv["ac"] += Fvv["ac"] + 2.0 * I.ovvv["kdac"] * t1["kd"] - I.ovvv["kcad"] * t1["kd"]  # ov3

        # two-body intermediates
        Woooo["klij"] += (I.oooo["kilj"] + I.ovoo["lcki"] * t1["jc"]    # o4v
                          + I.ovoo["kclj"] * t1["ic"] + I.ovov["kcld"] * tau["ijcd"])  # o4v2
        Wvoov["akic"] += (I.ovvv["kcad"] * t1["id"] - I.ovoo["kcli"] * t1["la"]        # o2v3
                          + I.ovov["kcia"]
                          - 0.5 * I.ovov["ldkc"] * t2["ilda"] - 0.5 * I.ovov["lckd"] * t2["ilad"]  # o3v3
                          - I.ovov["ldkc"] * t1["id"] * t1["la"] + I.ovov["ldkc"] * t2["ilad"])
        Wvovo["akci"] += (I.ovvv["kdac"] * t1["id"] - I.ovoo["lcki"] * t1["la"]        # o2v3
                          + I.oovv["kiac"]
                          - 0.5 * I.ovov["lckd"] * t2["ilda"]                          # o3v3
                          - I.ovov["lckd"] * t1["id"] * t1["la"])

    with ts.equations():
        # T1 (PySCF rccsd.update_amps, t1new)
        r1["ia"] += (Fvv["ac"] * t1["ic"] - Foo["ki"] * t1["ka"]
                     + 2.0 * Fov["kc"] * t2["kica"] - Fov["kc"] * t2["ikca"]
                     + Fov["kc"] * t1["ic"] * t1["ka"]
                     + 2.0 * I.ovov["kcia"] * t1["kc"] - I.oovv["kiac"] * t1["kc"]
                     + I.ovvv["kdac"] * theta["ikcd"]                                   # o2v3
                     - I.ovoo["lcki"] * theta["klac"])                                  # o3v2

        # T2: terms that are symmetric in (ia)<->(jb) go straight to r2
        r2["ijab"] += I.ovov["iajb"]
        r2["ijab"] += Woooo["klij"] * tau["klab"]                                      # o4v2
        r2["ijab"] += I.vvvv["acbd"] * tau["ijcd"]                                     # o2v4
        r2["ijab"] -= I.ovvv["kdac"] * t1["kb"] * tau["ijcd"]                          # o3v3
        r2["ijab"] -= I.ovvv["kcbd"] * t1["ka"] * tau["ijcd"]                          # o3v3

        # the rest, Z, enters as Z_ijab + Z_jiba
        Z["ijab"] += (I.ovvv["iacb"] * t1["jc"] - I.oovv["kibc"] * t1["ka"] * t1["jc"]  # o2v3
                      - I.ovov["kcia"] * t1["jc"] * t1["kb"] - I.ovoo["iajk"] * t1["kb"]  # o3v2
                      + Lvv["ac"] * t2["ijcb"] - Loo["ki"] * t2["kjab"]                 # o2v3, o3v2
                      + 2.0 * Wvoov["akic"] * t2["kjcb"] - Wvovo["akci"] * t2["kjcb"]   # o3v3
                      - Wvoov["akic"] * t2["kjbc"] - Wvovo["bkci"] * t2["kjac"])        # o3v3
        r2["ijab"] += Z["ijab"] + Z["jiba"]
    return r1, r2

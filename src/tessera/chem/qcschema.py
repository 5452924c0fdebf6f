"""QCSchema in and out (MolSSI's schema, validated by ``qcelemental``).

In: a QCSchema molecule, or an AtomicInput (its molecule, and its model's method and
basis), or an AtomicResult (the same, read back), as JSON. Out: an AtomicResult with the standard property names
(``scf_total_energy``, ``ccsd_correlation_energy``, ``ccsd_prt_pr_total_energy``, ...)
and provenance, so that QCEngine-style drivers can read Tessera's results.
QCSchema geometries are in bohr; they are converted with PySCF's bohr, so a molecule
round-trips to qcelemental's rounding of geometries (1e-8 bohr).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tessera.chem.molecule import BOHR_IN_ANGSTROM, Molecule
from tessera.errors import InputError

__all__ = ["is_qcschema", "read_qcschema", "atomic_result", "write_atomic_result"]

#: QCSchema method names -> ours
_METHODS = {"hf": "hf", "scf": "hf", "ccsd": "ccsd", "ccsd(t)": "ccsd(t)"}


def is_qcschema(path) -> bool:
    """Whether ``path`` names a JSON file (by suffix, or a first character ``{``)."""
    p = Path(str(path))
    if p.suffix.lower() == ".json":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(256).lstrip().startswith(b"{")
    except (OSError, ValueError):
        return False


def _validation_error(path, exc) -> InputError:
    detail = " ".join(str(exc).split())
    return InputError(f"{str(path)!r} is not a valid QCSchema molecule or AtomicInput ({detail[:300]}); "
                      f"expected JSON with schema_name qcschema_molecule or qcschema_input: fix the file")


def read_qcschema(path, *, charge: int = 0, basis: str = "cc-pvdz") -> tuple[Molecule, dict]:
    """(Molecule, model) from a QCSchema molecule or AtomicInput JSON file; ``model`` is
    ``{"method": ..., "basis": ...}`` of an AtomicInput, else empty. A molecular charge
    other than ``charge`` (when that is not 0) is an error, as is a multiplicity other
    than 1 or a ghost atom."""
    from qcelemental.models import AtomicInput, AtomicResult
    from qcelemental.models import Molecule as QCMolecule

    try:
        data = json.loads(Path(str(path)).read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise InputError(f"{str(path)!r} cannot be read ({exc.strerror}); expected a QCSchema JSON "
                         f"file: check the path") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{str(path)!r} is not JSON ({exc}); expected a QCSchema molecule or "
                         f"AtomicInput: fix the file") from None
    if not isinstance(data, dict):
        raise _validation_error(path, "top level is not an object")
    model: dict = {}
    try:
        if "molecule" in data:          # an AtomicInput, or an AtomicResult read back
            schema = str(data.get("schema_name", ""))
            inp = (AtomicResult if "output" in schema or "result" in schema else AtomicInput)(**data)
            if inp.driver != "energy":
                raise InputError(f"{str(path)!r}: driver {inp.driver!r} is not supported; expected "
                                 f"'energy': change the AtomicInput's driver")
            method = _METHODS.get(inp.model.method.lower())
            if method is None:
                raise InputError(f"{str(path)!r}: model method {inp.model.method!r} is not one of "
                                 f"{', '.join(_METHODS)}: change the AtomicInput's model")
            model = {"method": method, "basis": inp.model.basis} if inp.model.basis else {"method": method}
            qmol = inp.molecule
        else:
            qmol = QCMolecule(**data)
    except InputError:
        raise
    except Exception as exc:        # qcelemental reports bad data as pydantic's errors or whatever it hit
        raise _validation_error(path, exc) from None
    if qmol.molecular_multiplicity != 1:
        raise InputError(f"{str(path)!r}: multiplicity {qmol.molecular_multiplicity:g}; closed-shell "
                         f"methods need a singlet: change molecular_multiplicity to 1")
    if not all(qmol.real):
        raise InputError(f"{str(path)!r}: ghost atoms are not supported; expected real atoms only: "
                         f"remove them")
    mol_charge = int(round(qmol.molecular_charge))
    if charge and charge != mol_charge:
        raise InputError(f"--charge {charge} disagrees with the QCSchema molecular_charge "
                         f"{mol_charge}; expected one charge: drop --charge or fix the file")
    xyz = np.asarray(qmol.geometry, dtype=float).reshape(-1, 3) * BOHR_IN_ANGSTROM
    atoms = tuple((str(s), tuple(float(c) for c in r)) for s, r in zip(qmol.symbols, xyz))
    return Molecule(atoms=atoms, charge=mol_charge, basis=model.get("basis", basis),
                    title=qmol.name or ""), model


def atomic_result(data: dict) -> dict:
    """The QCSchema AtomicResult (as a dict, validated by qcelemental) of a Job's result
    ``data`` (``JobResult.data``)."""
    from qcelemental.models import AtomicResult

    import tessera

    mol = data["molecule"]
    if not mol.get("atoms"):
        raise InputError("a QCSchema result needs a molecule; an FCIDUMP has none: drop --qcschema")
    e = data["energies"]
    props = {"calcinfo_nbasis": data["nao"], "calcinfo_nmo": data["nocc"] + data["nvir"],
             "calcinfo_nalpha": data["nocc"], "calcinfo_nbeta": data["nocc"],
             "calcinfo_natom": len(mol["atoms"]), "scf_total_energy": e["hf"],
             "nuclear_repulsion_energy": data.get("nuclear_repulsion")}
    if "ccsd_correlation" in e:
        props.update(ccsd_correlation_energy=e["ccsd_correlation"],
                     ccsd_total_energy=e["hf"] + e["ccsd_correlation"],
                     ccsd_iterations=len(data.get("iterations", [])))
    if "t_correction" in e:
        props.update(ccsd_prt_pr_correlation_energy=e["ccsd_correlation"] + e["t_correction"],
                     ccsd_prt_pr_total_energy=e["total"])
    total = e.get("total", e["hf"])
    props["return_energy"] = total
    symbols = [s for s, _ in mol["atoms"]]
    geometry = (np.array([xyz for _, xyz in mol["atoms"]], dtype=float) / BOHR_IN_ANGSTROM).ravel()
    extras = {k: v for k, v in data.items() if k not in ("profile", "molecule")}
    result = AtomicResult(
        molecule={"symbols": symbols, "geometry": geometry.tolist(), "molecular_charge": mol["charge"],
                  "molecular_multiplicity": 1, "fix_com": True, "fix_orientation": True},
        driver="energy", model={"method": data["method"], "basis": data["basis"]},
        properties={k: v for k, v in props.items() if v is not None}, return_result=total,
        success=bool(data.get("converged", True)),
        provenance={"creator": "Tessera", "version": tessera.__version__, "routine": "tessera.chem.job"},
        extras={"tessera": json.loads(json.dumps(extras, default=float))})
    return json.loads(result.json())


def write_atomic_result(data: dict, path) -> None:
    """Write :func:`atomic_result` of ``data`` to ``path`` as JSON."""
    Path(str(path)).write_text(json.dumps(atomic_result(data), indent=1))   # errors: outputs.write_outputs

"""The fabric placement benchmark's smoke version (e2e/bench/fabric_bench.py): a small fleet on 8 racks,
through the operator's own plan, with units and with each group placed alone. No factory needed."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.bench import fabric_bench


def test_units_keep_kv_inside_a_domain_where_groups_placed_alone_do_not(tmp_path: Path) -> None:
    fabric_bench.main(["--racks", "8", "--deployments", "8", "--seeds", "2", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "fabric.json").read_text())
    assert doc["run"]["command"].startswith("python -m e2e.bench.fabric_bench")
    [run] = doc["runs"]
    units, alone = run["units"], run["groups_alone"]
    assert units["gpus_asked"] == alone["gpus_asked"] > 0
    assert units["gpus_placed"] == units["gpus_asked"], "room for every group at this size"
    assert units["units"] > 0
    assert units["units_whole"] == units["units"], "every unit inside one NVLink domain"
    assert units["kv_inside_domain_if_kept_in_unit"] == 1.0
    assert units["kv_inside_domain_if_paired_at_random"] > alone["kv_inside_domain_if_paired_at_random"]
    assert units["compute_domains"] < alone["compute_domains"], "one ComputeDomain per unit, not per group"


def test_a_lost_tray_moves_the_unit_where_it_fits_whole_and_a_lost_rack_is_replaced(tmp_path: Path) -> None:
    """A tray of a decode group in the fullest rack: the replacement goes where the whole unit fits and
    its prefill group follows (one Rejoin, its GPUs the cost): as many units whole after as before. A
    lost rack: its groups replaced, every unit whole again. Groups placed alone have no unit to keep."""
    fabric_bench.main(["--racks", "8", "--deployments", "8", "--seeds", "2", "--out", str(tmp_path)])
    [run] = json.loads((tmp_path / "fabric.json").read_text())["runs"]
    tray, rack = run["units"]["tray_loss"], run["units"]["rack_loss"]
    assert tray["groups_lost"] == 1
    assert tray["created"]["Replace"] == 1
    assert tray["created"]["Rejoin"] == 1
    assert tray["created"]["Rejoin GPUs"] > 0
    assert tray["after"]["units_whole"] == tray["before"]["units_whole"] == tray["before"]["units"]
    assert rack["groups_lost"] > 1
    assert rack["created"]["Replace"] == rack["groups_lost"]
    assert rack["after"]["units_whole"] == rack["after"]["units"]
    assert rack["after"]["gpus_serving"] == rack["before"]["gpus_serving"]
    assert "Rejoin" not in run["groups_alone"]["tray_loss"]["created"]

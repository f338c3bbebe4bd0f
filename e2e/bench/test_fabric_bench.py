"""The fabric placement benchmark's smoke version (e2e/bench/fabric_bench.py): a small fleet on 8 racks,
through the operator's own plan, with units and with each group placed alone. No factory needed."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.bench import fabric_bench


def test_units_keep_kv_inside_a_domain_where_groups_placed_alone_do_not(tmp_path: Path) -> None:
    fabric_bench.main(["--racks", "8", "--deployments", "8", "--seeds", "1", "--out", str(tmp_path)])
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

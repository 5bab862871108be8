"""bench.convergence's simulated figures say what they hold: a figure named _64 is 64 workers' or
null with a reason, and a gap or saving against an unsearched (untuned) baseline is withheld."""

from __future__ import annotations

from typing import Any

from bench.convergence import sim_figures


def _cell(saving: float, acc: float, sync_acc: float) -> dict[str, Any]:
    return {"saving_at_target": saving, "final_accuracy": acc, "sync_final_accuracy": sync_acc,
            "accuracy_gap_vs_sync": sync_acc - acc}


def test_a_quick_run_names_its_16_worker_saving_by_what_it_holds_and_withholds_the_untuned_gap() -> None:
    # what a --quick run measured: DDP at the square-root rule's rate ended at 33 %, the fleet at 78 %
    sim = sim_figures([_cell(0.86, 0.7833, 0.3333)], [_cell(0.8, 0.78, 0.3333)], [], workers=16,
                      searched=False, adaptive=False)
    f, why = sim["figures"], sim["reasons"]
    assert f["saving_sim_64"] is None
    assert why["saving_sim_64"] == ("this run simulated 16 workers, not 64 (--quick or --sim-workers): "
                                    "see saving_sim_16")
    assert f["saving_sim_16"] is None
    assert f["vcasgd_gap_30"] is None                        # it read -45 (points): the baseline's
    assert "ended at 33.3% accuracy (the fleet 78.3%)" in why["vcasgd_gap_30"]
    assert sim["spread"]["vcasgd_gap_30"]["values"] == [-45.0]    # kept, not dropped
    assert sim["spread"]["saving_sim_16"]["values"] == [0.86]
    assert f["sim_sync_final_accuracy"] == 0.3333
    assert f["adaptive_gap_50"] is None
    assert "--adaptive" in why["adaptive_gap_50"]


def test_a_searched_64_worker_run_reports_its_figures_in_points() -> None:
    sim = sim_figures([_cell(0.9, 0.95, 0.96), _cell(0.92, 0.955, 0.96)], [_cell(0.7, 0.96, 0.96)],
                      [0.3, 0.5], workers=64, searched=True, adaptive=True)
    f = sim["figures"]
    assert f["saving_sim_64"] == f["sim_saving"] == 0.91
    assert abs(f["vcasgd_gap_30"] - 0.75) < 1e-9              # points: DDP 96 %, the fleet 95.25 %
    assert f["adaptive_gap_50"] == f["adaptive_gap_mnist_50"] == 0.4
    assert sim["reasons"] == {}


def _seed(seed: int, saving: float | None, withheld: str | None = None) -> dict[str, Any]:
    return {"config": {"seed": seed}, "saving_at_target": saving, "final_accuracy": 0.9,
            "sync_final_accuracy": 0.95, "accuracy_gap_vs_sync": 0.05,
            "target_missed": None if withheld else saving is None, "target_withheld": withheld}


def test_a_cell_where_no_seed_reached_names_every_missed_seed_and_every_unusable_one() -> None:
    # found in the saved run: saving_same_machines reached 0 of 5, and its text named only seed 4
    # (no target), as if seeds 0-3 had not been run
    why = "the synchronous baseline did not learn (check --sync-lr)"
    hetero = [_seed(0, 0.4), _seed(1, None), _seed(2, 0.5), _seed(3, None), _seed(4, None, why)]
    same = [_seed(0, None), _seed(1, None), _seed(2, None), _seed(3, None), _seed(4, None, why)]
    sim = sim_figures(hetero, same, [], workers=64, searched=True, adaptive=True)
    assert sim["figures"]["saving_same_machines"] is None
    assert sim["reasons"]["saving_same_machines"] == (
        "no seed reached the target, so no saving: of 5 seed(s), 4 missed the target (seed(s) "
        "[0, 1, 2, 3]; counted in targets_missed), and 1 set no target (seed(s) [4]: "
        f"{why}; counted missing in the spread, not in targets_missed)")
    # 2 of 5 reached: the figure stands, its note names the seed without a target as before
    assert sim["figures"]["saving_sim_64"] == 0.45
    assert sim["reasons"]["saving_sim_64"].startswith("seed(s) [4]: no target, so no saving: ")
    assert sim["missing"] == 2 + 4                          # the misses, not the unusable seeds

    only_missed = sim_figures(hetero, same[:4], [], workers=64, searched=True, adaptive=True)
    assert only_missed["reasons"]["saving_same_machines"] == (
        "no seed reached the target, so no saving: of 4 seed(s), 4 missed the target (seed(s) "
        "[0, 1, 2, 3]; counted in targets_missed)")


def test_a_seed_whose_baseline_did_not_learn_has_no_gap_and_is_counted_not_measured() -> None:
    # the saved default run: seed 4's synchronous baseline stayed at chance, its gap read -85
    # points and the published vcasgd_gap_30 was -16 (the fleet "16 points ahead of DDP") while
    # the four other seeds had the fleet 0.6 to 1.9 points behind
    why = "the synchronous baseline did not learn (check --sync-lr)"
    hetero = [_seed(0, 0.4), _seed(1, 0.5), _seed(2, 0.45), _seed(3, 0.5), _seed(4, None, why)]
    hetero[4]["accuracy_gap_vs_sync"] = -0.85
    sim = sim_figures(hetero, [], [], workers=64, searched=True, adaptive=True)
    assert abs(sim["figures"]["vcasgd_gap_30"] - 5.0) < 1e-9     # the four seeds' 0.05, in points
    gap = sim["spread"]["vcasgd_gap_30"]
    assert gap["n"] == 4
    assert gap["reached"] == "4 of 5 seeds measured"
    assert gap["ci_high"] is None                                # the missing seed's side
    assert sim["reasons"]["vcasgd_gap_30"] == (
        f"seed(s) [4]: no gap: {why} (counted not measured, its side of the interval unbounded)")
    # the adaptive cells' gap the same way (a None from a cell whose baseline did not learn)
    adaptive = sim_figures(hetero[:4], [], [1.0, None, 2.0], workers=64, searched=True, adaptive=True)
    assert adaptive["figures"]["adaptive_gap_mnist_50"] == 1.5
    assert adaptive["figures"]["adaptive_gap_mnist_50_ci_high"] is None
    assert adaptive["reasons"]["adaptive_gap_mnist_50"].startswith("1 of 3 seed(s): no gap, ")

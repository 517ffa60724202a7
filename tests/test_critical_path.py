"""The critical path of level-3 event records: per-lane breakdowns that add up, the tensor cores'
idle time worked out by hand, the critical role per tile, and the level-1/2 fallback.

The helpers below build ``Trace.events`` frames with exactly the columns the event records
decode to, so the analysis is tested on what a recording gives it; ``test_diagnose`` uses them too.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tracegen
from jfa_prof.analyses.critical_path import critical_path, critical_path_of
from jfa_prof.records import BWD_ROLES, BWD_SITES, FWD_ROLES, FWD_SITES
from jfa_prof.trace import EVENT_COLUMNS, read_trace, trace_from_buffer

CYCLES_PER_NS = 2
DATA = Path(__file__).parent / "data" / "traces"


def events_frame(rows, roles=FWD_ROLES, sites=FWD_SITES) -> pd.DataFrame:
    """``Trace.events`` of hand-written records. Row keys: cta, role (name), pos, start, mark, end
    (ns from the first tile) and the ns waited per site by name (default 0)."""
    out = []
    for r in rows:
        rid = roles.index(r["role"])
        s, m, e = int(r["start"]), int(r["mark"]), int(r["end"])
        d = {"slot": r["pos"] * len(roles) + rid, "pos": r["pos"], "cta": r["cta"], "smid": r.get("smid", r["cta"]),
             "role_id": rid, "role": r["role"], "t_start": tracegen.GLOBALTIMER_EPOCH + s,
             "t_mark": tracegen.GLOBALTIMER_EPOCH + m, "t_end": tracegen.GLOBALTIMER_EPOCH + e,
             "c_start": CYCLES_PER_NS * s, "c_end": CYCLES_PER_NS * e, "start_ns": s, "mark_ns": m, "end_ns": e,
             "dur_ns": e - s, "dur_cycles": CYCLES_PER_NS * (e - s), "tile": r["pos"], "batch": r["pos"], "head": 0,
             "block": 0, "kv_len": 128 * r.get("n_blocks", 1), "n_blocks": r.get("n_blocks", 1)}
        d.update({f"wait_{st}": CYCLES_PER_NS * int(r.get(st, 0)) for st in sites})
        d.update({f"wait_{st}_ns": float(r.get(st, 0)) for st in sites})
        out.append(d)
    df = pd.DataFrame(out, columns=[*EVENT_COLUMNS, *(f"wait_{s}" for s in sites), *(f"wait_{s}_ns" for s in sites)])
    return df.sort_values(["cta", "role_id", "start_ns"], kind="stable").reset_index(drop=True)


def fwd_rows(tiles_per_cta=(3, 3), *, blocks=4, block_ns=1000, k_full=0, v_full=0, q_full=0, queue=0, mma_turn=0,
             epilogue=200, offset=500, k_empty=50, v_empty=0):
    """A persistent forward: per CTA, tiles back to back; per tile both consumers run ``blocks``
    blocks plus the given waits (ns per tile) and an ``epilogue``, consumer 1 ``offset`` ns behind
    consumer 0 (ping-pong); the next tile starts when consumer 0 is free again. The producer
    starts each tile 100 ns before the consumers and issues its last load when consumer 0's loop
    is nearly done, waiting ``k_empty`` / ``v_empty`` for free ring slots on the way."""
    rows, pos = [], 0
    for cta, n in enumerate(tiles_per_cta):
        t = 0
        for _ in range(n):
            for c in (0, 1):
                start = t + c * offset
                mark = start + blocks * block_ns + k_full + v_full + q_full + queue + mma_turn
                rows.append(dict(cta=cta, role=f"consumer{c}", pos=pos, start=start, mark=mark, end=mark + epilogue,
                                 n_blocks=blocks, k_full=k_full, v_full=v_full, q_full=q_full, queue=queue,
                                 mma_turn=mma_turn))
            rows.append(dict(cta=cta, role="producer", pos=pos, start=t - 100, mark=t,
                             end=rows[-2]["mark"] - block_ns // 2, k_empty=k_empty, v_empty=v_empty))
            t = rows[-3]["end"]  # consumer 0's end
            pos += 1
    return rows


def bwd_rows(tiles_per_cta=(3, 3), *, steps=4, step_ns=1000, kv_full=0, step_full=0, dq_stage=0, ds_pair=0,
             epilogue=300, kv_empty=200, step_empty=0, dq_full=0, dq_reduce=0):
    """A persistent backward: per CTA, the compute role runs ``steps`` steps plus the given waits
    (ns per tile) and an epilogue (the dK/dV stores). The producer takes each tile 300 ns before it
    and issues its K/V (mark) 100 ns before; its step loop then issues the steps' loads and the
    reduce-adds (``dq_reduce`` ns of it) until the compute role's last step."""
    rows, pos = [], 0
    for cta, n in enumerate(tiles_per_cta):
        t = 300
        for _ in range(n):
            mark = t + steps * step_ns + kv_full + step_full + dq_stage + ds_pair
            rows.append(dict(cta=cta, role="compute", pos=pos, start=t, mark=mark, end=mark + epilogue, n_blocks=steps,
                             kv_full=kv_full, step_full=step_full, dq_stage=dq_stage, ds_pair=ds_pair))
            rows.append(dict(cta=cta, role="producer", pos=pos, start=t - 300, mark=t - 100, end=mark - step_ns,
                             kv_empty=kv_empty, step_empty=step_empty, dq_full=dq_full, dq_reduce=dq_reduce))
            t = mark + epilogue
            pos += 1
    return rows


def bwd_frame(rows):
    return events_frame(rows, roles=BWD_ROLES, sites=BWD_SITES)


# ---------------------------------------------------------------------------------------------

def test_every_lane_adds_up_to_the_kernel_time():
    cp = critical_path(events_frame(fwd_rows((3, 2), k_full=300, v_full=100, mma_turn=200, queue=50)), n_ctas=3)
    assert cp.kernel_ns == pytest.approx(max(r["end"] for r in fwd_rows((3, 2), k_full=300, v_full=100, mma_turn=200,
                                                                            queue=50)) + 100)
    assert len(cp.lanes) == 9  # three roles of three CTAs, CTA 2 without a record
    assert np.allclose(cp.lanes["total_ns"], cp.kernel_ns, atol=1e-6)
    idle_cta = cp.lanes[cp.lanes["cta"] == 2]
    assert (idle_cta["tail_ns"] == cp.kernel_ns).all() and (idle_cta["n_records"] == 0).all()
    for role in FWD_ROLES:
        assert sum(cp.role_shares(role).values()) == pytest.approx(1.0)


def test_a_consumer_lane_by_hand():
    # One CTA, one tile: consumer 0 from 0 to 4300 (mark 4100), the kernel from -100 (the producer) to 4800.
    cp = critical_path(events_frame(fwd_rows((1,), k_full=100)))
    c0 = cp.lanes[cp.lanes["role"] == "consumer0"].iloc[0]
    assert cp.kernel_ns == 4900 and cp.t_begin_ns == -100
    assert (c0.wait_k_full_ns, c0.epilogue_ns, c0.compute_ns, c0.gap_ns, c0.tail_ns) == (100, 200, 4000, 100, 500)
    c1 = cp.lanes[cp.lanes["role"] == "consumer1"].iloc[0]
    assert (c1.gap_ns, c1.tail_ns) == (600, 0)


def test_tensor_cores_idle_from_the_intervals():
    # Consumer 0 [0, 4100) loop, [4100, 7100) epilogue; consumer 1 [500, 4600) loop, [4600, 7600)
    # epilogue. Both out of the loop from 4600 to 7600: 3000 ns, all with an epilogue running.
    cp = critical_path(events_frame(fwd_rows((1,), epilogue=3000, k_full=100)))
    idle = cp.idle.iloc[0]
    assert idle["epilogue"] == 3000
    assert idle["k_full"] == 100  # the mean of the two consumers, who wait for the same block
    assert idle["gaps"] == 100  # before either consumer had started: the producer's lead, -100 to 0
    assert idle["tail"] == 0  # consumer 1 ends the kernel
    assert cp.idle_shares()["epilogue"] == pytest.approx(3000 / cp.kernel_ns)
    assert cp.idle_share == pytest.approx((3000 + 100 + 100) / cp.kernel_ns)


def test_overlapped_epilogues_are_not_idle():
    # A short epilogue hides behind the other consumer's loop, except the last tile's.
    cp = critical_path(events_frame(fwd_rows((4,), epilogue=200)))
    assert cp.idle.iloc[0]["epilogue"] == 200


def test_mma_turn_is_not_idle():
    base = critical_path(events_frame(fwd_rows((2, 2))))
    turns = critical_path(events_frame(fwd_rows((2, 2), mma_turn=800)))
    assert turns.idle_ns("mma_turn") == pytest.approx(2 * 2 * 800)  # per CTA: 2 tiles × 800, mean of the consumers
    assert turns.idle_ns("epilogue") == base.idle_ns("epilogue")
    assert sum(turns.idle.iloc[0][s] for s in ("k_full", "v_full", "q_full", "queue")) == 0
    assert turns.turns_share == pytest.approx(2 * 2 * 800 / turns.basis_ns)
    assert "mma_turn" in turns.summary and "is not idle" in turns.summary


def test_tail_of_an_imbalanced_schedule():
    cp = critical_path(events_frame(fwd_rows((4, 1))))
    lanes = cp.lanes.set_index(["cta", "role"])
    tile = 4 * 1000 + 200  # a consumer's tile
    assert lanes.loc[(1, "consumer0"), "tail_ns"] == pytest.approx(3 * tile + 500)
    # both consumers of CTA 1 done: from its consumer 1's end to the kernel's end
    assert cp.idle.set_index("cta").loc[1, "tail"] == pytest.approx(3 * tile)
    assert cp.idle.set_index("cta").loc[0, "tail"] == 0


def test_slow_producer_is_on_the_critical_path():
    cp = critical_path(events_frame(fwd_rows((3, 3), k_full=1500, v_full=300, mma_turn=200)))
    assert cp.critical_counts() == {"producer": 6}
    assert cp.dominant_counts() == {"k_full": 6}
    assert cp.tiles["data_ns"].tolist() == [1800.0] * 6
    assert cp.tiles["noncompute_ns"].tolist() == [1800.0 + 200 + 200] * 6
    assert cp.summary.startswith("tensor cores idle ")
    assert "consumers waiting on k_full" in cp.summary and "(producer late)" in cp.summary
    assert "(estimate)" in cp.summary


def test_consumers_are_on_the_critical_path_when_they_wait_on_each_other():
    cp = critical_path(events_frame(fwd_rows((2,), k_full=100, mma_turn=900)))
    assert cp.critical_counts() == {"consumers": 2}
    assert cp.dominant_counts() == {"mma_turn": 2}


def test_backward_compute_role():
    cp = critical_path(bwd_frame(bwd_rows((2, 2), step_full=900, dq_stage=100, ds_pair=50)), pass_="bwd")
    assert np.allclose(cp.lanes["total_ns"], cp.kernel_ns)
    idle = cp.idle.set_index("cta")
    assert idle.loc[0, "step_full"] == 2 * 900 and idle.loc[0, "dq_stage"] == 200 and idle.loc[0, "ds_pair"] == 100
    assert idle.loc[0, "epilogue"] == 2 * 300  # one lane: its own epilogue
    assert "mma_turn" not in cp.idle.columns
    assert cp.critical_counts() == {"producer": 4} and cp.dominant_counts() == {"step_full": 4}
    assert "the compute role waiting on step_full" in cp.summary
    dq = critical_path(bwd_frame(bwd_rows((2,), dq_stage=900)), pass_="bwd")
    assert dq.dominant_counts() == {"dq_stage": 2} and "dQ reduce-adds behind" in dq.summary
    pair = critical_path(bwd_frame(bwd_rows((2,), ds_pair=900)), pass_="bwd")
    assert pair.critical_counts() == {"compute": 2}


def test_sampled_records_are_scaled_over_the_unrecorded_tiles():
    ev = events_frame(fwd_rows((8, 8), k_full=400))
    full = critical_path(ev)
    # The same run with every other tile's events recorded; the tile records (consumer 0's) are all there.
    tiles = ev[ev["role"] == "consumer0"][["cta", "start_ns", "end_ns"]]
    sampled = critical_path(ev[ev["pos"] % 2 == 0], sample=2, tiles=tiles, makespan_ns=full.kernel_ns - 100)
    assert sampled.kernel_ns == full.kernel_ns
    assert np.allclose(sampled.lanes["total_ns"], sampled.kernel_ns)
    # the recorded tiles' waits stand for the unrecorded ones too: the shares come out the same
    assert sampled.idle_shares()["k_full"] == pytest.approx(full.idle_shares()["k_full"], rel=0.02)
    c0 = sampled.lanes[sampled.lanes["role"] == "consumer0"].iloc[0]
    assert (c0.gap_ns, c0.tail_ns) == (100, 500)  # the holes are work, not gaps
    assert c0.wait_k_full_ns == pytest.approx(8 * 400)
    assert sampled.idle["unrecorded"].gt(0).all()
    assert any("every 2th tile" in n for n in sampled.notes)


def test_no_events_is_refused():
    with pytest.raises(ValueError, match="level-3"):
        critical_path(events_frame([]))


# ---- below level 3 -----------------------------------------------------------------------------

def test_level2_wait_totals():
    buf, meta, truth = tracegen.persistent_run([4, 4, 2, 2, 1, 1], n_ctas=2, n_sms=4)
    tr = trace_from_buffer(buf, {**meta, "profile_level": 2})
    cp = critical_path_of(tr)
    assert cp.level == 2 and not cp.has_events and len(cp.tiles) == 0
    assert np.allclose(cp.lanes["total_ns"], cp.kernel_ns)
    assert math.isnan(cp.idle_shares()["epilogue"]) and "epilogue unknown" in cp.summary
    assert "level-2" in cp.notes[0]
    # consumer 0 of CTA 0 waited 100 cycles per block on k_full at 1.98 cycles per ns
    blocks = int(truth[truth["cta"] == 0]["n_blocks"].sum())
    c0 = cp.lanes[(cp.lanes["cta"] == 0) & (cp.lanes["role"] == "consumer0")].iloc[0]
    assert c0.wait_k_full_ns == pytest.approx(100 * blocks / 1.98, rel=1e-3)
    # the mean of the two consumers (100 and 80 cycles per block)
    assert cp.idle.set_index("cta").loc[0, "k_full"] == pytest.approx(90 * blocks / 1.98, rel=1e-3)


def test_level1_has_only_the_idle_ctas():
    tr = read_trace(DATA / "small_hsp_lq128_kv1024_s0.5_lpt_tiles.jfatrace")
    cp = critical_path_of(tr)
    assert cp.level == 1 and np.allclose(cp.lanes["total_ns"], cp.kernel_ns)
    # No waits below level 2: the idle table has only what spans and tiles give.
    assert "k_full" not in cp.idle.columns or cp.idle["k_full"].sum() == 0
    assert cp.idle_shares()["tail"] > 0.01


def test_recorded_backward_trace():
    tr = read_trace(DATA / "h200_bwd_hsp_lq128_kv1024_s0.1_static_level2_a5cf585.jfatrace")
    cp = critical_path_of(tr)
    assert cp.pass_ == "bwd" and cp.n_ctas == 132
    assert np.allclose(cp.lanes["total_ns"], cp.kernel_ns)
    assert 0 < cp.idle_shares()["dq_stage"] < 0.2
    assert cp.kernel_ns >= tr.makespan_ns


# ---- sampling, on the committed H200 recordings --------------------------------------------------

def _subsampled(path, sample):
    from jfa_prof.trace import read_trace

    tr = read_trace(path)
    ev = tr.events[tr.events["pos"] % sample == 0]  # what a launch with SAMPLE = sample records
    return tr, critical_path(ev, pass_=tr.pass_, makespan_ns=tr.makespan_ns, n_ctas=tr.n_ctas, sample=sample,
                             tiles=tr.tiles)


@pytest.mark.parametrize("name,sample", [("h200_fwd_hsp_lq256_kv2048_s0.5_op_level3.jfatrace", 4),
                                         ("h200_bwd_hsp_lq256_kv2048_s0.5_op_level3.jfatrace", 5)])
def test_a_sampled_recording_gives_the_shares_of_the_full_one(name, sample):
    from jfa_prof.trace import bundled_dir, read_trace

    path = bundled_dir() / "roles" / name
    tr = read_trace(path)
    full = critical_path_of(tr)
    _, part = _subsampled(path, sample)
    assert part.sample == sample and full.sample == 1
    # The unrecorded tiles are work, not gaps: before the first recorded one too. A role's waits
    # between tiles fall outside every recorded window when a neighbour went unrecorded, so a
    # sampled recording books them as the unrecorded tiles' work: its gaps share can only shrink,
    # and the idle share with it, by at most the full recording's gaps.
    full_idle, part_idle = full.idle_shares(), part.idle_shares()
    for k in ("epilogue", "tail"):
        assert part_idle[k] == pytest.approx(full_idle[k], abs=0.005), k
    assert part_idle["gaps"] <= full_idle["gaps"] + 0.005
    lost = full_idle["gaps"] - part_idle["gaps"]
    assert full.idle_share - lost - 0.005 <= part.idle_share <= full.idle_share + 0.005
    # The tensor roles' parts, what the diagnosis ranks, with the gaps folded into the work that
    # absorbs them when sampled.
    tensor = ("consumer0", "consumer1", "compute")

    def shares(cp):
        s = cp.roles[cp.roles["role"].isin(tensor)].set_index(["role", "part"])["share"]
        for role in s.index.get_level_values("role").unique():
            if (role, "gaps") in s.index:
                s[(role, "compute")] += s.pop((role, "gaps"))
        return s

    both = pd.concat([shares(full), shares(part)], axis=1, keys=["full", "part"]).dropna()
    assert len(both) >= 6 and (both["full"] - both["part"]).abs().max() < 0.015, both


def test_a_sample_that_leaves_ctas_without_records_is_refused():
    from jfa_prof.errors import BadInputError
    from jfa_prof.trace import bundled_dir

    # Static backward, 132 CTAs dealt positions c, c + 132, ...: every 4th position misses 3 CTAs in 4.
    with pytest.raises(BadInputError, match="CTA\\(s\\) ran tiles of which none has an event record"):
        _subsampled(bundled_dir() / "roles" / "h200_bwd_hsp_lq256_kv2048_s0.5_op_level3.jfatrace", 4)


def test_the_launch_refuses_a_sample_that_would_skip_ctas():
    torch = pytest.importorskip("torch")
    from jfa_prof.kernels.attention import _record_buffer
    from jfa_prof.records import FWD_ROLES, FWD_SITES

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="coprime to 132, e.g. 5"):
        _record_buffer(3, 1000, 132, FWD_ROLES, FWD_SITES, 4, False, cpu)
    layout, rec = _record_buffer(3, 1000, 132, FWD_ROLES, FWD_SITES, 5, False, cpu)
    assert layout.event_capacity == 200 * 3 and int(rec[2]) == 5
    layout, _ = _record_buffer(3, 1000, 132, FWD_ROLES, FWD_SITES, 4, True, cpu)  # dynamic: positions spread
    assert layout.event_capacity == 250 * 3

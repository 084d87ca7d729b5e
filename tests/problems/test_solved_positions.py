"""Solver-labelled test positions: the generator's determinism and labels, the shipped
sets, Pons's notation and the movers."""

import numpy as np
import pytest

from async_search.problems import (ConnectFour, ConnectFourSolver, SolvedPosition,
                                   connect_four_positions)
from async_search.problems.solved_positions import (MOVERS, STAGES,
                                                          from_pons_moves,
                                                          generate_positions,
                                                          informed_move, pons_moves,
                                                          random_move)
from async_search.problems.connect_four_solver import optimal_moves_of_scores, outcome

GAME = ConnectFour()


@pytest.fixture(scope="module")
def shipped():
    return {stage: connect_four_positions(stage) for stage in STAGES}


# -- the generator ----------------------------------------------------------------------

@pytest.mark.parametrize("source", sorted(MOVERS))
def test_the_same_seed_gives_the_same_positions(source):
    first = generate_positions(6, stones=(30, 36), source=source, seed=4)
    again = generate_positions(6, stones=(30, 36), source=source, seed=4)
    other = generate_positions(6, stones=(30, 36), source=source, seed=5)
    assert first == again
    assert [p.moves for p in first] != [p.moves for p in other]


def test_generated_positions_carry_the_solvers_labels():
    positions = generate_positions(12, stones=(28, 33), source="selfplay", seed=1,
                                   stage="probe")
    solver = ConnectFourSolver()
    for p in positions:
        assert p.state == GAME.from_moves(p.moves) and 28 <= len(p.moves) <= 33
        assert GAME.terminal_value(p.state) is None
        assert p.move_scores == solver.move_scores(p.state)
        assert p.score == solver.solve(p.state) and p.outcome == outcome(p.score)
        assert p.optimal_moves == solver.optimal_moves(p.state)
        assert len(p.optimal_moves) < len(GAME.legal_actions(p.state))  # not trivial
        assert p.source == "selfplay" and p.stage == "probe"


def test_trivial_positions_are_kept_on_request():
    positions = generate_positions(30, stones=(36, 40), source="random", seed=0,
                                   skip_trivial=False)
    trivial = [p for p in positions
               if len(p.optimal_moves) == len(GAME.legal_actions(p.state))]
    assert trivial  # late random positions often leave no choice that matters
    assert all(len(p.moves) <= 40 for p in positions)


class FirstColumnSolver:
    """A stand-in solver that calls the lowest legal column the only optimal move."""

    def move_scores(self, state):
        legal = GAME.legal_actions(state)
        return tuple(None if c not in legal else 1 if c == legal[0] else -1
                     for c in range(7))


def test_one_stone_positions_are_seven_up_to_mirror_images():
    positions = generate_positions(4, stones=(1, 1), source="random", seed=0,
                                   solver=FirstColumnSolver())
    assert sorted(min(p.moves[0], 6 - p.moves[0]) for p in positions) == [0, 1, 2, 3]
    assert all(p.optimal_moves == (0,) and p.score == 1 for p in positions)


def test_asking_for_more_positions_than_the_range_holds_gives_up():
    with pytest.raises(ValueError, match="found only 4 of 5 positions with 1 to 1 stones"):
        generate_positions(5, stones=(1, 1), source="random", seed=0,
                           solver=FirstColumnSolver())


def test_no_position_repeats_nor_mirrors_another():
    positions = generate_positions(40, stones=(28, 29), source="selfplay", seed=2)
    states = {p.state for p in positions}
    assert len(states) == 40
    for p in positions:
        mirrored = GAME.from_moves([6 - c for c in p.moves])
        assert mirrored == p.state or mirrored not in states


@pytest.mark.parametrize("kwargs, match", [
    (dict(stones=(30, 20), source="random", seed=0), "stones\\[1\\]"),
    (dict(stones=(30, 42), source="random", seed=0), "stones\\[1\\]"),
    (dict(stones=30, source="random", seed=0), "pair"),
    (dict(stones=(30, 32), source="mcts", seed=0), "source"),
    (dict(stones=(30, 32), source="random", seed=-1), "seed"),
    (dict(stones=(30, 32), source=["random"], seed=0), "source must be one of"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_positions(1, **kwargs)


# -- the shipped sets -------------------------------------------------------------------

def test_the_shipped_sets_have_their_sizes_sources_and_stages(shipped):
    for stage, (low, high) in STAGES.items():
        positions = shipped[stage]
        assert len(positions) == 200
        assert all(isinstance(p, SolvedPosition) and p.stage == stage for p in positions)
        assert [p.source for p in positions] == ["random"] * 100 + ["selfplay"] * 100
        assert all(low <= len(p.moves) <= high for p in positions)
        assert len({p.state for p in positions}) == 200
        assert connect_four_positions(stage, source="selfplay") == positions[100:]


def test_the_shipped_labels_are_consistent(shipped):
    for positions in shipped.values():
        for p in positions:
            legal = GAME.legal_actions(p.state)
            assert p.state == GAME.from_moves(p.moves)
            assert GAME.terminal_value(p.state) is None
            assert [c for c, s in enumerate(p.move_scores) if s is not None] == list(legal)
            assert p.score == max(s for s in p.move_scores if s is not None)
            assert p.optimal_moves == optimal_moves_of_scores(p.move_scores)
            assert 0 < len(p.optimal_moves) < len(legal)


def test_the_shipped_end_game_labels_are_the_solvers(shipped):
    solver = ConnectFourSolver()
    for p in shipped["end"]:
        assert solver.move_scores(p.state) == p.move_scores


def test_some_shipped_middle_game_labels_are_the_solvers(shipped):
    solver = ConnectFourSolver()
    late = [p for p in shipped["middle"] if len(p.moves) >= 24][:10]
    assert len(late) == 10
    for p in late:
        assert solver.optimal_moves(p.state) == p.optimal_moves


def test_the_shipped_sets_are_what_the_generator_gives(shipped):
    # write_connect_four_positions seeds set i, source j (sorted) with 10 i + j.
    for i, stage in enumerate(STAGES):
        for j, source in enumerate(sorted(MOVERS)):
            fresh = generate_positions(3, stones=STAGES[stage], source=source,
                                       seed=10 * i + j, stage=stage)
            assert fresh == connect_four_positions(stage, source=source)[:3]


def test_unknown_stages_and_sources_are_refused():
    with pytest.raises(ValueError, match="stage"):
        connect_four_positions("begin")
    with pytest.raises(ValueError, match="source"):
        connect_four_positions("end", source="human")
    # a list was a TypeError (unhashable), not the error that names the choices
    with pytest.raises(ValueError, match="stage must be one of"):
        connect_four_positions(["end"])
    with pytest.raises(ValueError, match="source must be None or one of"):
        connect_four_positions("end", source=["random"])


# -- notation and movers ----------------------------------------------------------------

def test_pons_notation_round_trips():
    columns = (3, 3, 0, 6, 5, 1, 2)
    assert pons_moves(columns) == "4417623"
    assert from_pons_moves(pons_moves(columns)) == columns
    for bad in ("408", "4a", 44):
        with pytest.raises(ValueError, match="digits 1..7"):
            from_pons_moves(bad)


def test_the_informed_mover_wins_then_blocks_then_avoids_giving_a_win():
    rng = np.random.default_rng(0)
    win = GAME.from_moves([0, 6, 0, 6, 0, 5])         # X wins in column 0
    assert all(informed_move(GAME, win, rng) == 0 for _ in range(20))
    block = GAME.from_moves([0, 6, 0, 6, 0])          # O must block column 0
    assert all(informed_move(GAME, block, rng) == 0 for _ in range(20))
    # O wins on row 1 of column 5, and again on row 2 once X blocks there: X blocks
    # all the same (every move loses, the block latest).
    lost = GAME.from_moves([6, 3, 4, 6, 0, 2, 5, 4, 2, 3, 6, 6])
    assert GAME.render(lost).splitlines()[-2:] == ["..XOO.O", "X.OOXXX"]
    assert all(informed_move(GAME, lost, rng) == 5 for _ in range(20))
    # X to move; O holds row 1 of columns 1-3 and would win on row 1 of column 0 or 4
    # once X fills the cell below: X must play neither.
    trap = GAME.from_moves([1, 2, 3, 1, 6, 2, 6, 3])
    assert GAME.render(trap).splitlines()[-2:] == [".OOO..X", ".XOX..X"]
    moves = {informed_move(GAME, trap, rng) for _ in range(200)}
    assert moves == {1, 2, 3, 5, 6}


def test_the_random_mover_plays_every_legal_column():
    rng = np.random.default_rng(0)
    state = GAME.from_moves([0] * 6)
    assert {random_move(GAME, state, rng) for _ in range(300)} == set(range(1, 7))

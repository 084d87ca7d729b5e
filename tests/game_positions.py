"""Connect Four positions for the tests of nets: encoded states of seeded random games."""

import numpy as np

from async_search.problems import ConnectFour

GAME = ConnectFour()


def connect_four_positions(count: int, seed: int = 0, max_moves: int = 30) -> np.ndarray:
    """``count`` encoded positions, each after up to ``max_moves`` random moves (a game
    that ends sooner stops there, so terminal positions are among them)."""
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(count):
        state = GAME.initial_state()
        for _ in range(int(rng.integers(0, max_moves))):
            legal = GAME.legal_actions(state)
            if not legal:
                break
            state = GAME.play(state, legal[int(rng.integers(len(legal)))])
        states.append(state)
    return GAME.encode(states)

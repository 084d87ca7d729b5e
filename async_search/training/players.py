"""Players for two-player games: baselines, and players that use a network.

A ``Player`` picks a move with ``await player.choose(game, state, rng)``. Baselines need
no model (``RandomPlayer``, ``OnePlyPlayer``, ``UCTPlayer``, a pure-Python UCT with
random rollouts); ``MCTSPlayer`` (PUCT), ``GumbelPlayer`` (Gumbel AlphaZero) and
``PolicyPlayer`` play with a policy-value network through an ``evaluate`` callable. The
search players can keep their tree through their move and the opponent's reply
(``reuse_tree``).
"""

from __future__ import annotations

import collections
import math
from typing import Any, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_float, check_int
from async_search.problems.base import Game, State
from async_search.problems.connect_four import ConnectFour, ConnectFourState
from async_search.search.base import check_evaluate, evaluated, policy_logits_of
from async_search.search.gumbel import gumbel_mcts
from async_search.search.puct import mcts
from async_search.search.reuse import subtree
from async_search.search.tree import Tree, priors_from_logits


@runtime_checkable
class Player(Protocol):
    """Something that plays a game: ``await player.choose(game, state, rng)``.

    ``choose`` returns one of ``game.legal_actions(state)`` (the state is never
    terminal) and draws any randomness it needs from ``rng``, so that a match is a
    deterministic function of its seed.
    """

    name: str
    """A short label for reports, e.g. ``"uct300"``."""

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        """The action to play in ``state``."""


def _legal(game: Game, state: State, who: str) -> Tuple[int, ...]:
    legal = game.legal_actions(state)
    if not legal:
        raise ValueError(f"{who}: cannot choose a move in a finished game ({game!r}, "
                         f"state {state!r}); pass a state with a legal action")
    return legal


def _mover_won(game: Game, state: State) -> bool:
    # terminal_value is for the player to move: below zero, the player who just moved won.
    value = game.terminal_value(state)
    return value is not None and value < 0


class RandomPlayer:
    """Plays a uniformly random legal action (the rating anchor, ``RANDOM_RATING``).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(RandomPlayer().choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    name = "random"

    def __repr__(self) -> str:
        return "RandomPlayer()"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        return int(legal[int(rng.integers(len(legal)))])


class OnePlyPlayer:
    """Takes a win, else blocks the opponent's immediate win, else plays at random.

    Generic over ``Game``: a win is an action after which ``terminal_value`` is
    negative (the mover won). A threat is an action ``b`` with which the opponent would
    win right after some other move ``a != b`` of ours; if there are threats the player
    plays one (the only one, or a random one of several: the game is lost anyway).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> state = game.from_moves([0, 6, 1, 6, 2, 5])     # column 3 wins
        >>> asyncio.run(OnePlyPlayer().choose(game, state, np.random.default_rng(0)))
        3
    """

    name = "one-ply"

    def __repr__(self) -> str:
        return "OnePlyPlayer()"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        after = [game.play(state, a) for a in legal]
        for a, s in zip(legal, after):
            if _mover_won(game, s):
                return int(a)
        threats = set()
        for a, s in zip(legal, after):
            for b in game.legal_actions(s):
                if b != a and b not in threats and _mover_won(game, game.play(s, b)):
                    threats.add(b)
        blocks = [a for a in legal if a in threats]
        choices = blocks or legal
        return int(choices[int(rng.integers(len(choices)))])


class _Uniforms:
    """Uniform floats in [0, 1) drawn from ``rng`` in chunks: one call per chunk."""

    __slots__ = ("rng", "chunk", "values", "index")

    def __init__(self, rng: np.random.Generator, chunk: int = 2048):
        self.rng, self.chunk = rng, chunk
        self.values: List[float] = []
        self.index = 0

    def refill(self) -> None:
        self.values = self.rng.random(self.chunk).tolist()
        self.index = 0


class _UCTNode:
    __slots__ = ("state", "action", "untried", "children", "visits", "value")

    def __init__(self, state: State, action: int, legal: Sequence[int]):
        self.state = state
        self.action = action
        self.untried = list(legal)
        self.children: List[_UCTNode] = []
        self.visits = 0
        self.value = 0.0  # summed outcomes for the player who moved INTO this node


def _random_playout(game: Game, state: State, legal: Sequence[int],
                    uniforms: _Uniforms) -> float:
    """The outcome of a uniformly random game from ``state``, for its player to move."""
    play, legal_actions = game.play, game.legal_actions
    values, i = uniforms.values, uniforms.index
    sign = 1.0
    while legal:
        if i >= len(values):
            uniforms.refill()
            values, i = uniforms.values, 0
        state = play(state, legal[int(values[i] * len(legal))])
        i += 1
        sign = -sign
        legal = legal_actions(state)
    uniforms.index = i
    return sign * float(game.terminal_value(state))


def _connect_four_playout(game: ConnectFour, state: ConnectFourState,
                          legal: Sequence[int], uniforms: _Uniforms) -> float:
    """``_random_playout`` on Connect Four's bitboards, about three times faster.

    It draws the same uniforms and makes the same moves as the generic playout (legal
    columns ascending, ``legal[int(u * len(legal))]``), so it returns the same outcome.
    """
    if not legal:
        return float(game.terminal_value(state))
    stride, rows = game.rows + 1, game.rows
    mine, theirs = state
    both = mine | theirs
    # heights[c]: the bit of column c's lowest empty cell.
    heights = [c * stride + ((both >> (c * stride)) & ((1 << rows) - 1)).bit_length()
               for c in range(game.columns)]
    legal = list(legal)
    s1, s2, s3 = stride - 1, stride, stride + 1
    values, i = uniforms.values, uniforms.index
    sign = 1.0
    while legal:
        if i >= len(values):
            uniforms.refill()
            values, i = uniforms.values, 0
        k = int(values[i] * len(legal))
        i += 1
        column = legal[k]
        height = heights[column]
        mine |= 1 << height
        heights[column] = height + 1
        if height + 1 == column * stride + rows:
            del legal[k]
        sign = -sign
        # Four in a row for the mover: vertical, horizontal and both diagonals.
        pairs = mine & (mine >> 1)
        if (pairs & (pairs >> 2) or (pairs := mine & (mine >> s2)) & (pairs >> 2 * s2)
                or (pairs := mine & (mine >> s1)) & (pairs >> 2 * s1)
                or (pairs := mine & (mine >> s3)) & (pairs >> 2 * s3)):
            uniforms.index = i
            return -sign  # the mover won: -1 for the side to move now, times sign
        mine, theirs = theirs, mine
    uniforms.index = i
    return 0.0


def _uct_visit_counts(game: Game, state: State, rollouts: int, c: float,
                     rng: np.random.Generator) -> dict:
    """Run ``rollouts`` UCT iterations from ``state``; visits of each root action."""
    root = _UCTNode(state, -1, _legal(game, state, "UCT"))
    playout = _connect_four_playout if type(game) is ConnectFour else _random_playout
    uniforms = _Uniforms(rng)
    uniforms.refill()
    log, sqrt = math.log, math.sqrt
    for _ in range(rollouts):
        node, path = root, [root]
        # Selection: UCB1 over fully expanded nodes.
        while not node.untried and node.children:
            explore = c * c * log(node.visits)
            best, best_score = node.children[0], -math.inf
            for child in node.children:
                n = child.visits
                score = child.value / n + sqrt(explore / n)
                if score > best_score:
                    best, best_score = child, score
            node = best
            path.append(node)
        # Expansion: one random untried action, swap-removed.
        if node.untried:
            if uniforms.index >= len(uniforms.values):
                uniforms.refill()
            untried = node.untried
            k = int(uniforms.values[uniforms.index] * len(untried))
            uniforms.index += 1
            action = untried[k]
            untried[k] = untried[-1]
            untried.pop()
            child_state = game.play(node.state, action)
            legal = game.legal_actions(child_state)
            child = _UCTNode(child_state, action, legal)
            node.children.append(child)
            path.append(child)
            outcome = playout(game, child_state, legal, uniforms)
        else:  # a terminal node: its exact value
            outcome = float(game.terminal_value(node.state))
        # Backup: the outcome is for the leaf's player to move; a node stores it for
        # the player who moved into it, so the sign flips at every level.
        reward = -outcome
        for visited in reversed(path):
            visited.visits += 1
            visited.value += reward
            reward = -reward
    return {child.action: child.visits for child in root.children}


class UCTPlayer:
    """Plain UCT: a UCB1 tree grown by one node per iteration, random rollouts.

    Each of ``rollouts`` iterations descends the tree by UCB1
    (``mean + c * sqrt(ln N / n)``), expands one random untried action, plays uniformly
    random moves to the end of the game and backs the outcome up with a sign flip per
    ply. The most visited root action is played (ties: the lowest action). Terminal
    nodes back up their exact value, so an immediate win (+1 on every visit) draws the
    visits. Pure Python over the ``Game`` protocol; deterministic given ``rng``.

    Args:
        rollouts: iterations per move (>= 1).
        c: the exploration constant (>= 0).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> state = game.from_moves([0, 6, 1, 6, 2, 5])     # column 3 wins
        >>> asyncio.run(UCTPlayer(100).choose(game, state, np.random.default_rng(0)))
        3
    """

    def __init__(self, rollouts: int, c: float = 1.4):
        self.rollouts = check_int("rollouts", rollouts, minimum=1)
        self.c = check_float("c", c, minimum=0.0)
        self.name = f"uct{self.rollouts}"

    def __repr__(self) -> str:
        return f"UCTPlayer(rollouts={self.rollouts}, c={self.c})"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        if len(legal) == 1:
            return int(legal[0])
        visits = _uct_visit_counts(game, state, self.rollouts, self.c, rng)
        return int(max(legal, key=lambda a: (visits.get(a, 0), -a)))


class KeptTrees:
    """The trees a search player keeps between its moves, one per game in play.

    A player never sees the opponent's move, and one player object plays many games at
    once (``play_match`` runs them concurrently). A game is told apart by its ``rng``:
    ``play_match`` gives each game its own generator for the whole game, so the tree
    kept after our move in a game is found again with that game's ``rng``. The
    opponent's reply is found by comparing states: the kept tree's root is the position
    after our move, and the child whose state is the position we are asked about is
    the reply's subtree (``search.reuse.subtree``). Anything else (a new game, an
    unexplored reply) gives None: a fresh search. The oldest trees are dropped beyond
    ``capacity`` (finished games are never announced).
    """

    def __init__(self, capacity: int = 4096):
        # (-1 failed at the first move kept, with a KeyError from the empty table)
        self.capacity = check_int("KeptTrees capacity", capacity, minimum=1)
        # id(rng) -> (rng, tree rooted after our move); the rng is held so that its id
        # cannot be reused by another game's generator while the entry lives.
        self._trees: "collections.OrderedDict[int, Tuple[Any, Tree]]" = (
            collections.OrderedDict())

    def __len__(self) -> int:
        return len(self._trees)

    def take(self, state: State, rng: Any) -> Optional[Tree]:
        """The kept subtree rooted at ``state`` for the game of ``rng``, or None."""
        entry = self._trees.pop(id(rng), None)
        if entry is None or entry[0] is not rng:
            return None
        tree = entry[1]
        if tree.node_state[0] == state:  # the player moves twice in a row (self-play)
            return tree
        for e in tree.edges(0):
            node = tree.edge_child[e]
            if node and tree.node_state[node] == state:
                return subtree(tree, tree.edge_action[e])
        return None

    def keep(self, tree: Optional[Tree], rng: Any) -> None:
        """Keeps ``tree`` (rooted at the position after our move) for ``rng``'s game."""
        if tree is None:
            return
        self._trees[id(rng)] = (rng, tree)
        while len(self._trees) > self.capacity:
            self._trees.popitem(last=False)


class _TreeSearchPlayer:
    """What ``MCTSPlayer`` and ``GumbelPlayer`` share: the checked network, budget, name
    and ``reuse_tree``, and a move: the subclass's ``_search`` from the kept subtree
    (with ``reuse_tree``), its action played and the subtree under it kept."""

    def __init__(self, evaluate: Evaluate, simulations: int, num_parallel: int,
                 name: str, reuse_tree: bool):
        check_evaluate(evaluate)
        self.evaluate = evaluate
        self.simulations = check_int("simulations", simulations, minimum=1)
        self.num_parallel = check_int("num_parallel", num_parallel, minimum=1)
        self.name = str(name)
        if not isinstance(reuse_tree, bool):
            raise ValueError(f"reuse_tree must be True or False, got {reuse_tree!r}")
        self.reuse_tree = reuse_tree
        self.kept = KeptTrees()

    async def _search(self, game: Game, state: State, reuse: Optional[Tree]) -> Any:
        """The search's result (``action``, ``subtree``) from ``state``; ``reuse`` as
        for ``search.mcts``."""
        raise NotImplementedError

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        # No noise: the search is deterministic and uses rng only to tell games apart.
        reuse = self.kept.take(state, rng) if self.reuse_tree else None
        result = await self._search(game, state, reuse)
        if self.reuse_tree:
            self.kept.keep(result.subtree(result.action), rng)
        return int(result.action)


class MCTSPlayer(_TreeSearchPlayer):
    """AlphaZero MCTS (``search.mcts``) without root noise: plays the most visited action.

    Args:
        evaluate: the policy-value network, ``await evaluate(game.encode(states))``.
        simulations: simulations per move (>= 1).
        num_parallel: leaves in flight per tree, evaluated in one request (>= 1).
        c_puct: PUCT's exploration constant (> 0).
        name: the label in reports.
        reuse_tree: keep the tree through the move played and the opponent's reply
            (``KeptTrees``): the next search starts from the subtree of the position
            reached, when the search had explored it.
        solve: prove values as the search goes (``search.mcts``'s ``solve``).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search.problems import ConnectFour, PolicyValueMLP
        >>> game = ConnectFour()
        >>> player = MCTSPlayer(asr.immediate(PolicyValueMLP(game)), simulations=16)
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(player.choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    def __init__(self, evaluate: Evaluate, simulations: int = 100, num_parallel: int = 8,
                 c_puct: float = 1.25, name: str = "mcts", reuse_tree: bool = False,
                 solve: bool = False):
        super().__init__(evaluate, simulations, num_parallel, name, reuse_tree)
        self.c_puct = check_float("c_puct", c_puct, minimum=0.0, strict=True)
        if not isinstance(solve, bool):
            raise ValueError(f"solve must be a bool, got {solve!r}")
        self.solve = solve

    def __repr__(self) -> str:
        return (f"MCTSPlayer(simulations={self.simulations}, "
                f"num_parallel={self.num_parallel}, c_puct={self.c_puct}, "
                f"name={self.name!r}, reuse_tree={self.reuse_tree}, solve={self.solve})")

    async def _search(self, game: Game, state: State, reuse: Optional[Tree]) -> Any:
        return await mcts(game, state, self.evaluate, num_simulations=self.simulations,
                          num_parallel=self.num_parallel, c_puct=self.c_puct,
                          dirichlet_fraction=0.0, reuse=reuse, keep_tree=self.reuse_tree,
                          solve=self.solve)


class GumbelPlayer(_TreeSearchPlayer):
    """Gumbel AlphaZero search (``search.gumbel_mcts``) without noise
    (``gumbel_scale=0``): plays the action Sequential Halving chooses.

    Args:
        evaluate: the policy-value network, ``await evaluate(game.encode(states))``.
        simulations: simulations per move (>= 1).
        num_parallel: leaves in flight per tree, evaluated in one request (>= 1).
        max_num_considered_actions: root actions considered (>= 1).
        c_visit, c_scale: ``sigma``'s constants (>= 0).
        name: the label in reports.
        reuse_tree: keep the tree through the move played and the opponent's reply, as
            ``MCTSPlayer`` does.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search.problems import ConnectFour, PolicyValueMLP
        >>> game = ConnectFour()
        >>> player = GumbelPlayer(asr.immediate(PolicyValueMLP(game)), simulations=16)
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(player.choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    def __init__(self, evaluate: Evaluate, simulations: int = 32, num_parallel: int = 8,
                 max_num_considered_actions: int = 16, c_visit: float = 50.0,
                 c_scale: float = 0.1, name: str = "gumbel", reuse_tree: bool = False):
        super().__init__(evaluate, simulations, num_parallel, name, reuse_tree)
        self.max_num_considered_actions = check_int(
            "max_num_considered_actions", max_num_considered_actions, minimum=1)
        self.c_visit = check_float("c_visit", c_visit, minimum=0.0)
        self.c_scale = check_float("c_scale", c_scale, minimum=0.0)

    def __repr__(self) -> str:
        return (f"GumbelPlayer(simulations={self.simulations}, "
                f"num_parallel={self.num_parallel}, "
                f"max_num_considered_actions={self.max_num_considered_actions}, "
                f"c_visit={self.c_visit}, c_scale={self.c_scale}, name={self.name!r}, "
                f"reuse_tree={self.reuse_tree})")

    async def _search(self, game: Game, state: State, reuse: Optional[Tree]) -> Any:
        return await gumbel_mcts(
            game, state, self.evaluate, num_simulations=self.simulations,
            max_num_considered_actions=self.max_num_considered_actions,
            num_parallel=self.num_parallel, c_visit=self.c_visit, c_scale=self.c_scale,
            gumbel_scale=0.0, reuse=reuse, keep_tree=self.reuse_tree)


class PolicyPlayer:
    """Plays the legal action with the largest policy logit (ties: the lowest action).

    One request of one state per move: the raw network, no search. Logits that the
    search refuses (NaN or +inf for a legal action, or -inf for all of them) raise
    ``ModelOutputError`` as they do in ``MCTSPlayer``.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search.problems import ConnectFour, PolicyValueMLP
        >>> game = ConnectFour()
        >>> player = PolicyPlayer(asr.immediate(PolicyValueMLP(game)))
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(player.choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    def __init__(self, evaluate: Evaluate, name: str = "policy"):
        check_evaluate(evaluate)
        self.evaluate = evaluate
        self.name = str(name)

    def __repr__(self) -> str:
        return f"PolicyPlayer(name={self.name!r})"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        y = await evaluated(self.evaluate, game.encode([state]))  # (a model: named)
        num_actions = int(game.num_actions)
        row = policy_logits_of(y, 1, num_actions)[0]
        # The search's own check: max() never replaces a NaN it meets first, so a NaN
        # logit would be played over every legal move.
        priors_from_logits(legal, row)
        return int(max(legal, key=lambda a: (row[a], -a)))

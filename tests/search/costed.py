"""Small problems whose step costs a test chooses: the searches' checks of step costs."""

import numpy as np

import async_search as asr


class Costed:
    """A problem on integer states whose steps cost ``cost``; subclasses say which
    steps there are (``neighbors``) and which states are goals."""

    input_spec = asr.TensorSpec((1,), np.float32)

    def __init__(self, cost):
        self.cost = cost

    def check_state(self, state):
        pass

    def is_goal(self, state):
        return False

    def encode(self, states):
        return np.asarray(states, np.float32)[:, None]


class CostsOf(Costed):
    """0 -> 1 -> 2 -> 1 ...: a cycle whose steps cost ``cost`` (no goal)."""

    def neighbors(self, state):
        return {0: [(1, 1.0)], 1: [(2, self.cost)], 2: [(1, self.cost)]}[state]


class Line(Costed):
    """0 -> 1 -> 2 -> 3 (the goal), each step costing ``cost``."""

    def neighbors(self, state):
        return [(state + 1, self.cost)] if state < 3 else []

    def is_goal(self, state):
        return state == 3


class Diamond(Costed):
    """0 -> 1 -> 3 costs 100 + 200, 0 -> 2 -> 3 costs 150 + 100 (the cheapest), with
    costs of type ``cost`` (a NumPy scalar type, say) times ``scale``."""

    def neighbors(self, state):
        w = [self.cost(100 * self.scale), self.cost(200 * self.scale),
             self.cost(150 * self.scale), self.cost(100 * self.scale)]
        return {0: [(1, w[0]), (2, w[2])], 1: [(3, w[1])], 2: [(3, w[3])], 3: []}[state]

    def __init__(self, cost, scale=1):
        super().__init__(cost)
        self.scale = scale

    def is_goal(self, state):
        return state == 3


class Shortcut(Costed):
    """0 -> 2 (the goal) costs 15 ``scale``, 0 -> 1 -> 2 costs 9 + 1 (the cheapest)."""

    def __init__(self, scale):
        super().__init__(scale)

    def neighbors(self, state):
        return {0: [(2, 15 * self.cost), (1, 9 * self.cost)], 1: [(2, self.cost)],
                2: []}[state]

    def is_goal(self, state):
        return state == 2

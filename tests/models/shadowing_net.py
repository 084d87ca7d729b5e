"""A net whose module defines an exception named as a built-in one, raised bare (no
call) in its forward pass: TorchScript names it only on the quoted source line."""

import torch


class LookupError(Exception):  # noqa: A001 - shadows the built-in, on purpose
    """This module's own, not the built-in of that name."""


class RaisesItsOwn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 1)
        self.tag = "#"

    def forward(self, x):
        if bool((x < -100).any()):
            raise LookupError
        if bool((x > 100).any()):
            raise ValueError  # a caller's bad input, said after the raise
        if self.tag == "#" and bool((x > 50).any()): raise KeyError  # was: raise TypeError  # noqa: E501,E701
        elif bool((x < -50).any()): raise IndexError  # noqa: E701
        return self.linear(x)


def prefix_every_name(module, state, prefix, local):
    """A state_dict hook that renames every weight (as wrappers do): "w." + name."""
    for key in list(state):
        state["w." + key] = state.pop(key)


class RenamesItsWeights(torch.nn.Module):
    """A state_dict hook that renames every weight."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 1)
        self._register_state_dict_hook(prefix_every_name)

    def forward(self, x):
        return self.linear(x)


class ReassignsRenamedTiedBuffers(torch.nn.Module):
    """One buffer tensor under two names, renamed by a state_dict hook, and assigned a
    new tensor by each forward pass (in a compiled copy, there only)."""

    def __init__(self):
        super().__init__()
        offset = torch.zeros(6)
        self.register_buffer("offset", offset)
        self.register_buffer("alias", offset)
        self._register_state_dict_hook(prefix_every_name)

    def forward(self, x):
        self.alias = self.alias.clone()
        return x + self.alias


class ShrinksItsBuffer(torch.nn.Module):
    """A forward that gives its buffer another shape."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.zeros(6))

    def forward(self, x):
        self.offset = self.offset[:1].clone()
        return x + self.offset


class CopiesInAHook(ShrinksItsBuffer):  # (a forward that keeps the buffer's shape)
    """A state_dict hook that reads each value as NumPy: it works on the detached
    tensors of a plain state_dict(), and fails on a Parameter (keep_vars=True)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self._register_state_dict_hook(CopiesInAHook._copy)

    @staticmethod
    def _copy(module, state, prefix, local):
        for key in list(state):
            state[key].numpy()

    def forward(self, x):
        return self.linear(x) + self.offset


class ShrinksOneOfTiedBuffers(torch.nn.Module):
    """One tensor under two names (the second not saved); the forward reassigns the
    first, smaller, and leaves the second as it was."""

    def __init__(self):
        super().__init__()
        ones = torch.ones(6)
        self.register_buffer("a", ones)
        self.register_buffer("b", ones, persistent=False)

    def forward(self, x):
        self.a = self.a[:1].clone()
        return x + self.a + self.b


class GrowsItsBuffer(torch.nn.Module):
    """A forward that widens its (1,) buffer to (6,): a (1,) weight staged before
    would broadcast into it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.zeros(1))

    def forward(self, x):
        self.offset = self.offset.expand(6).clone()
        return x + self.offset

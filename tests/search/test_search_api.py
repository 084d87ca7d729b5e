import async_search
from async_search import search


def test_public_names_match_all():
    modules = {"alphazero", "astar", "base", "continuous", "frontier", "rollout", "tree",
               "annotations", "accuracy"}
    public = {n for n in dir(search) if not n.startswith("_")} - modules
    assert set(search.__all__) == public
    assert all(hasattr(search, n) for n in search.__all__)


def test_contract_names_are_importable_from_the_package():
    from async_search import problems, search as s  # noqa: F401
    for name in ("batched_astar", "continuous_astar", "mcts", "multi_rollout",
                 "simple_rollout"):
        assert callable(getattr(s, name))
    for name in ("SlidingPuzzle", "ConnectFour", "SyntheticGraph"):
        assert isinstance(getattr(problems, name), type)
    assert async_search.search is s

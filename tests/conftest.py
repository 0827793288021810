"""Suite order: the longest test file first. scripts/test.sh runs the suite on two xdist workers
that take whole files (``--dist loadfile``) in collection order, so the two-phase demo's test
(about a third of the suite's process time) starts at once on one worker while the other works
through the rest."""

FIRST = ("test_demo.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in FIRST)  # stable: the rest keep their order

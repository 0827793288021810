"""Suite order: the longest test files first. scripts/test.sh runs the suite on two xdist workers
that take whole files (``--dist loadfile``) in collection order (``--no-loadscope-reorder``:
xdist would otherwise send the files with the most tests first), so the rehearsal of the
paper's walk and the two-phase demo's test (together about half the suite's process time) start
at once, one on each worker, while the rest follows."""

FIRST = ("test_rehearsal.py", "test_demo.py")


def pytest_collection_modifyitems(session, config, items):
    # stable: the rest keep their order
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST
               else len(FIRST))

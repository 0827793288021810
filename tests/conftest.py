"""Suite order: the longest test files first. scripts/test.sh runs the suite on two xdist workers
that take whole files (``--dist loadfile``) in collection order (``--no-loadscope-reorder``:
xdist would otherwise send the files with the most tests first), so the rehearsal of the
paper's walk and the two-phase demo's test (together about half the suite's process time) start
at once, one on each worker, then the other files of several minutes, so that the last files
either worker takes are short ones and both finish at about the same time."""

FIRST = ("test_rehearsal.py", "test_demo.py", "test_train.py", "test_slurm.py",
         "test_build_pool.py", "test_actor.py", "test_evaluate.py")


def pytest_collection_modifyitems(session, config, items):
    # stable: the rest keep their order
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST
               else len(FIRST))

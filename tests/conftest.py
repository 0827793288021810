"""Time limits scaled to the machine, and the suite's order.

Every time limit of the suite (pytest's per-test ``timeout``, the ini's or a test's own marker,
and the tests' own waits through ``speed.scaled``) was set on the developers' machine; on a
slower or loaded one they grow by the speed factor measured once at the start
(tests/helpers/speed.py), which the header prints.

Suite order: the longest test files first. scripts/test.sh runs the suite on two xdist workers
that take whole files (``--dist loadfile``) in collection order (``--no-loadscope-reorder``:
xdist would otherwise send the files with the most tests first), so the rehearsal of the
paper's walk and the two-phase demo's test (together about half the suite's process time) start
at once, one on each worker, then the other files of several minutes, so that the last files
either worker takes are short ones and both finish at about the same time."""

import launch
import speed

FIRST = ("test_rehearsal.py", "test_demo.py", "test_slurm_rollout_nodes.py", "test_train.py",
         "test_slurm.py", "test_async_rollout.py", "test_build_pool.py", "test_actor.py",
         "test_evaluate.py", "test_storage.py", "test_own_task.py", "test_tools_run.py")


def pytest_configure(config):
    speed.factor()  # measured in the controller; workers and subprocesses inherit it
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        launch.share_cores()  # in each worker (not the controller, whose setting they inherit)


def pytest_report_header(config):
    return f"machine speed factor {speed.factor():.2f} (time limits scaled by it)"


def pytest_collection_modifyitems(session, config, items):
    import pytest

    base = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = marker.args[0] if marker and marker.args else base
        if seconds:
            item.add_marker(pytest.mark.timeout(speed.scaled(seconds)), append=False)
    # stable: the rest keep their order
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST
               else len(FIRST))

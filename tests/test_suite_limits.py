"""The suite's own time limits (tests/conftest.py, tests/helpers/speed.py): scaled by the
machine's measured speed, the per-test limit and a test's own waits alike, and the rehearsal's
waits inside its limit."""

import re
import subprocess
import sys
from pathlib import Path

import speed

TESTS = Path(__file__).resolve().parent

PROBE = '''
import pytest
from speed import scaled

@pytest.mark.timeout(100)
def test_marked(request):
    print("LIMIT", request.node.get_closest_marker("timeout").args[0], scaled(100))

def test_default(request):
    print("LIMIT", request.node.get_closest_marker("timeout").args[0], scaled(900))
'''


def test_limits_grow_with_the_measured_slowness(tmp_path):
    probe = TESTS / f"test_zz_probe_{tmp_path.name}.py"
    probe.write_text(PROBE)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                               str(probe)], cwd=TESTS.parent, capture_output=True, text=True,
                              timeout=120, env={**__import__("os").environ,
                                                speed.VARIABLE: "2.5"})
    finally:
        probe.unlink()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.findall(r"LIMIT (\d+) (\d+)", done.stdout) == [("250", "250"), ("2250", "2250")]
    assert "machine speed factor 2.50" in done.stdout


def test_the_rehearsal_waits_inside_its_own_limit():
    source = (TESTS / "test_rehearsal.py").read_text()
    limit = int(re.search(r"@pytest.mark.timeout\((\d+)\)", source).group(1))
    submit = int(re.search(r"timeout=scaled\((\d+)\)\)\n    assert done.returncode", source).group(1))
    jobs = int(re.search(r"deadline = time.time\(\) \+ scaled\((\d+)\)", source).group(1))
    assert submit + jobs + 200 <= limit  # 200 s for the checks after the jobs (about 30 here)


def test_the_factor_is_one_here_or_more_and_measured_once():
    assert speed.factor() >= 1.0
    assert speed.workload_seconds(repeats=1) > 0


RETENTION_PROBE = '''
def test_passes(tmp_path):
    (tmp_path / "checkpoint").write_bytes(b"x" * 1000)

def test_fails(tmp_path):
    (tmp_path / "checkpoint").write_bytes(b"x" * 1000)
    assert False
'''


def test_a_passing_tests_files_go_at_once_a_failing_tests_stay(tmp_path):
    """pytest.ini's retention: the end-to-end tests' checkpoints (up to 8 GB a test) must not
    pile up over the suite (a CI run filled the disk so) but stay where a test failed."""
    probe = TESTS / f"test_zz_retention_{tmp_path.name}.py"
    probe.write_text(RETENTION_PROBE)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               f"--basetemp={tmp_path / 'base'}", str(probe)], cwd=TESTS.parent,
                              capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    assert [p.parent.name for p in (tmp_path / "base").glob("*0/checkpoint")] == ["test_fails0"]


def test_too_little_disk_for_the_suite_is_one_sentence_before_it_starts():
    done = subprocess.run(["bash", "scripts/test.sh", "-k", "nothing"], cwd=TESTS.parent,
                          capture_output=True, text=True, timeout=speed.scaled(300),
                          env={**__import__("os").environ, "TEST_DISK_GIB": "1000000"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.fullmatch(r"error: \S+ has \d+ GiB free and the suite needs 1000000 GiB there; "
                        r"free space \(old pytest runs lie in \S+\) or point TMPDIR at a larger "
                        r"disk", done.stderr.strip().splitlines()[-1]), done.stderr
    assert "passed" not in done.stdout

"""A fork made while a warm-up thread imports a module waits for that import (runtime/warming/forks.py):
the child, importing the same module, would otherwise hang for good on its inherited module lock."""
import subprocess
import sys
import textwrap

import pytest

from conftest import python_env

SCRIPT = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    thread_name, wait_s, patience = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    from flytune_build.runtime.warming import forks, warmup  # warmup registers the wait
    forks.WAIT_S = wait_s
    th = threading.Thread(target=lambda: __import__("slowmod"), name=thread_name, daemon=True)
    th.start()
    started = os.path.join(sys.argv[1], "started")
    while not os.path.exists(started):   # the thread is inside slowmod's import (it made the file first)
        time.sleep(0.005)
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        import slowmod
        os._exit(0 if slowmod.X == 1 else 3)
    waited = time.monotonic() - t
    deadline = time.monotonic() + patience   # a child that hangs waits on a lock no thread of its own holds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child", os.waitstatus_to_exitcode(status), "waited", round(waited, 1), flush=True)
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung", "waited", round(waited, 1), flush=True)
    t = time.monotonic()
    second = os.fork()                   # a later fork: waits again only if the first did not give up
    if second == 0:
        os._exit(0)
    os.waitpid(second, 0)
    print("again", round(time.monotonic() - t, 1), flush=True)
""")


def fork_during_import(tmp_path, thread_name, wait_s=10.0, slow=1.5, patience=15.0):
    (tmp_path / "slowmod.py").write_text(f"import os, time\nopen(os.path.join({str(tmp_path)!r}, 'started'), 'w')"
                                         f".close()\ntime.sleep({slow})\nX = 1\n")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), thread_name, str(wait_s), str(patience)],
                       capture_output=True, text=True, env=python_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split(), r.stderr


@pytest.mark.skipif(not hasattr(__import__("os"), "register_at_fork"), reason="no fork here")
def test_a_fork_waits_for_a_warmup_threads_import_and_the_child_imports_that_module(tmp_path):
    out, err = fork_during_import(tmp_path, "flytune-warmup-auto")
    assert out[:2] == ["child", "0"], out
    assert 1.0 <= float(out[3]) < 10, out   # it waited for the import's end (about 1.5 s of it), no more
    assert "flytune" not in err


@pytest.mark.skipif(not hasattr(__import__("os"), "register_at_fork"), reason="no fork here")
def test_a_fork_during_another_threads_import_is_left_alone_and_its_child_hangs(tmp_path):
    # the hazard itself, and the guard's bound: only the warm-up's threads are waited for
    out, _ = fork_during_import(tmp_path, "someone-elses-thread", patience=3.0)
    if out[:2] == ["child", "0"]:
        pytest.skip("this interpreter resets module import locks in a forked child")
    assert out[:2] == ["child", "hung"] and float(out[3]) < 0.5, out


@pytest.mark.skipif(not hasattr(__import__("os"), "register_at_fork"), reason="no fork here")
def test_a_fork_waits_at_most_wait_s_then_goes_on_with_one_warning_and_no_later_fork_waits_again(tmp_path):
    out, err = fork_during_import(tmp_path, "flytune-warmup", wait_s=2.0, slow=60, patience=3.0)
    assert out[:2] == ["child", "hung"] and 2.0 <= float(out[3]) < 30, out
    assert "a fork waited 2 s for the warm-up's import of slowmod and went on" in err
    assert out[4] == "again" and float(out[5]) < 1.5, out   # given up on: the next fork does not wait 2 s again

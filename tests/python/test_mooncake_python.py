# SPDX-License-Identifier: Apache-2.0
"""The route to Mooncake through its Python client (docs/stores.md,
"Mooncake through its Python client"), on a stand-in for that client
(tests/mooncake_standin: mooncake.store over a table of this process's):
the route a Cache takes and says, the package's C ABI over the client
(python/mooncake_py/mooncake_py.c) under the same Mooncake backend as the C ABI,
its answers for what the client cannot answer (an exception, a batch
answer of the wrong length), Mooncake's codes classified by the backend's
one table, and a C program (the tool) that starts Python for the client.
tests/mooncake_real runs the same route on a real Mooncake Store."""
import os
import subprocess
import sys

import pytest

import ectest
import encache
from ectest import F32, lookup_one, publish_one, same_bits, sample, unique
from encache import Outcome

# The package's C ABI prints what a client's call raised (as unraisable):
# the injected exceptions of these tests.
pytestmark = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning")

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "..", "mooncake_standin")
SHIM = os.path.join(os.path.dirname(encache.__file__), "_libs",
                    "libencache_mooncake_py.so")


@pytest.fixture
def client_json(tmp_path):
    return ectest.mooncake_client_json(tmp_path)


@pytest.fixture
def standin(monkeypatch, client_json):
    """The stand-in importable as `mooncake`, the route's environment
    restored after the test; yields (url, mooncake.store)."""
    if not os.path.exists(SHIM):
        pytest.skip(f"{SHIM} is not built")
    try:
        import mooncake
    except ImportError:
        mooncake = None
    if mooncake is not None and \
            not os.path.dirname(mooncake.__file__).startswith(
                os.path.realpath(STANDIN)):
        pytest.skip("this Python has the real mooncake (tests/mooncake_real "
                    "runs there)")
    monkeypatch.syspath_prepend(os.path.realpath(STANDIN))
    for v in ("ENCACHE_MOONCAKE_LIBRARY", "ENCACHE_MOONCAKE_PYTHON",
              "ENCACHE_STORE"):
        monkeypatch.delenv(v, raising=False)
    import mooncake.store
    mooncake.store.reset()
    yield "mooncake:" + client_json, mooncake.store
    mooncake.store.reset()


def test_the_route_is_python_and_said(standin, caplog):
    url, _ = standin
    caplog.set_level("INFO", logger="encache")
    encache._mooncake._said.discard("python")  # said once per process
    assert encache.mooncake_route(url) == "python"
    assert "Mooncake Store route python" in caplog.text
    assert os.environ["ENCACHE_MOONCAKE_LIBRARY"] == SHIM
    assert os.environ["ENCACHE_MOONCAKE_PYTHON"] == sys.executable
    assert encache.mooncake_route("tier:shm://x?size=1MiB+" + url) == "python"
    assert encache.mooncake_route("shm://x?size=1MiB") is None
    assert encache.mooncake_route(None) is None  # no ENCACHE_STORE


def test_hits_are_bit_exact_through_the_python_client(standin, open_cache):
    url, store = standin
    c = open_cache(url)
    assert c.mooncake_route == "python"
    for rows, cols in ((64, 64), (512, 512)):  # staging, then direct
        id_ = unique("py")
        want = sample(rows, cols, seed=rows)
        publish_one(c, id_, want)
        r = lookup_one(c, id_, F32, (rows, cols))
        assert r.outcome == Outcome.HIT, r.why
        assert same_bits(r.tensor, want)
    s = c.stats()
    assert (s.hits, s.published_written, s.poisoned) == (2, 2, False)
    # Each write asks existence first; a lookup of 16 KiB reads at once
    # (its miss too), one of 1 MiB asks existence and reads its hits only,
    # into the tensor (docs/stores.md).
    assert store.CALLS["put_from"] == 2
    assert store.CALLS["batch_get_into"] == 3
    assert store.CALLS["batch_is_exist"] == 2 + 2
    r = lookup_one(c, unique("none"), F32, (4, 4))
    assert r.outcome == Outcome.MISS and "not in the Store" in r.why


def test_an_exception_in_a_read_poisons(standin, open_cache):
    url, store = standin
    c = open_cache(url)
    publish_one(c, "p", sample(4, 4))
    store.INJECT["batch_get_into"] = "raise"
    with pytest.raises(encache.PoisonedError):
        c.lookup([("p", F32, (4, 4))])
    assert c.stats().poisoned


@pytest.mark.parametrize("answer", ["short", "text"])
def test_a_read_answer_that_is_not_one_code_a_key_poisons(
        standin, open_cache, answer):
    url, store = standin
    c = open_cache(url)
    publish_one(c, "p", sample(4, 4))
    store.INJECT["batch_get_into"] = answer
    with pytest.raises(encache.PoisonedError):
        c.lookup([("p", F32, (4, 4))])


@pytest.mark.parametrize("code,outcome", [
    (-900, Outcome.UNAVAILABLE), (-901, Outcome.UNAVAILABLE),
    (-200, Outcome.UNAVAILABLE), (-704, Outcome.MISS),
    (-800, None), (-706, None), (-12345, None)])
def test_read_codes_are_classified_by_the_backends_table(
        standin, open_cache, code, outcome):
    """None: the read is unconfirmed, the Cache poisoned."""
    url, store = standin
    c = open_cache(url)
    publish_one(c, "p", sample(4, 4))
    store.INJECT["batch_get_into"] = code
    if outcome is None:
        with pytest.raises(encache.PoisonedError):
            c.lookup([("p", F32, (4, 4))])
    else:
        r = lookup_one(c, "p", F32, (4, 4))
        assert r.outcome == outcome, r.why
        assert not c.stats().poisoned


@pytest.mark.parametrize("code,poisons", [
    (-200, False), (-900, False), (-704, False), (-800, True),
    ("raise", True)])
def test_write_answers_are_classified_by_the_backends_table(
        standin, open_cache, code, poisons):
    url, store = standin
    c = open_cache(url)
    store.INJECT["put_from"] = code
    with c.lookup([("w", F32, (4, 4))]) as step:
        assert step.publish("w", sample(4, 4)) == encache.Skip.QUEUED
    if poisons:
        with pytest.raises(encache.PoisonedError):
            c.flush()
    else:
        c.flush()
        s = c.stats()
        assert (s.published_failed, s.poisoned) == (1, False)


def test_a_failed_existence_check_goes_on_to_the_put(standin, open_cache):
    """As vLLM's publisher: an existence check that fails is no answer of
    presence, so the put is made."""
    url, store = standin
    c = open_cache(url)
    store.INJECT["batch_is_exist"] = "raise"
    publish_one(c, "e", sample(4, 4))
    s = c.stats()
    assert (s.published_written, s.poisoned) == (1, False)


def test_purge_removes_by_regex_through_the_client(standin, open_cache):
    url, store = standin
    c = open_cache(url, model=unique("purge"))
    publish_one(c, "a", sample(4, 4))
    publish_one(c, "b", sample(4, 4))
    assert encache.purge(url, c.namespace) == (2, None)
    assert store.CALLS["remove_by_regex"] == 1


def _tool(url, cwd=None, **env):
    tool = os.environ.get("ENCACHE_TOOL")
    if not tool:
        pytest.skip("ENCACHE_TOOL is not set (tests/python/run.sh sets it)")
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("ENCACHE_MOONCAKE")}
    e.update(env)
    return subprocess.run([os.path.abspath(tool), "--store", url, "stats"],
                          env=e, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_tool_starts_python_for_the_client(standin):
    url, _ = standin
    p = _tool(url, ENCACHE_MOONCAKE_LIBRARY=SHIM,
              ENCACHE_MOONCAKE_PYTHON=sys.executable,
              PYTHONPATH=os.path.realpath(STANDIN))
    assert p.returncode == 0, p.stderr
    assert "kind          mooncake" in p.stdout


def test_a_relative_python_is_taken_from_the_current_directory(standin):
    url, _ = standin
    here, name = os.path.split(sys.executable)
    p = _tool(url, cwd=here, ENCACHE_MOONCAKE_LIBRARY=SHIM,
              ENCACHE_MOONCAKE_PYTHON="./" + name,
              PYTHONPATH=os.path.realpath(STANDIN))
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("python,said", [
    ("/nonexistent/python3", "cannot ask /nonexistent/python3"),
    (sys.executable, "has no package mooncake")])
def test_the_tool_says_why_python_cannot_serve(standin, python, said):
    url, _ = standin
    p = _tool(url, ENCACHE_MOONCAKE_LIBRARY=SHIM,
              ENCACHE_MOONCAKE_PYTHON=python, PYTHONPATH="")
    assert p.returncode != 0
    assert said in p.stderr, p.stderr


def _route_in_child(env_extra, path_extra=""):
    """[route, 1 when the child has a package mooncake, else 0]"""
    code = ("import encache, importlib.util\n"
            "print(encache.mooncake_route('mooncake:'))\n"
            "print(int(importlib.util.find_spec('mooncake') is not None))")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ENCACHE_MOONCAKE")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [path_extra] + sys.path if p)
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_another_library_is_the_c_abi_route():
    fake = os.environ.get("ENCACHE_FAKE_MOONCAKE_LIB", "/x/libmc.so")
    assert _route_in_child({"ENCACHE_MOONCAKE_LIBRARY": fake})[0] == "c-abi"


def test_without_mooncake_the_route_is_none():
    route, has = _route_in_child({})
    if has == "1":
        pytest.skip("this Python has mooncake")
    assert route == "none"

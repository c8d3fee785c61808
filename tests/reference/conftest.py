"""Shared pytest fixtures for the reference tests.

These tests compare dserve against references we did not write (transformers,
tokenizers, gguf). Expensive fixtures (tiny checkpoints, reference outputs) are cached
under $DSERVE_CACHE/fixtures, keyed by a hash of what produced them, so a second run
reuses them.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DSERVE_BUILD_DIR", REPO / "build"))


def cache_dir() -> pathlib.Path:
    """Where fixtures are cached: $DSERVE_FIXTURE_CACHE if set (`make test-py-fresh`
    points it at an empty directory), else $DSERVE_CACHE/fixtures."""
    root = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    d = pathlib.Path(os.environ.get("DSERVE_FIXTURE_CACHE", root / "fixtures"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def content_key(*parts) -> str:
    """A short hash of the given values (source text, configs, seeds) for cache keys."""
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def run(args, check=True, **kw):
    """Runs a command, capturing text output; fails the test with stderr on error."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        pytest.fail(f"{args} exited {r.returncode}\nstderr:\n{r.stderr[-4000:]}")
    return r


@pytest.fixture(scope="session")
def dserve_bin() -> pathlib.Path:
    p = build_dir() / "dserve"
    assert p.exists(), f"{p} not built; run `make build`"
    return p


@pytest.fixture(scope="session")
def test_tool():
    """test_tool("gguf_dump") -> path of a test-only binary in <build>/test_tools."""
    def get(name: str) -> pathlib.Path:
        p = build_dir() / "test_tools" / name
        assert p.exists(), f"{p} not built"
        return p
    return get


@pytest.fixture(scope="session")
def default_model() -> pathlib.Path:
    p = pathlib.Path(os.environ.get(
        "DSERVE_MODEL",
        pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
        / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert p.exists(), f"default model {p} missing; run `make model`"
    return p


@pytest.fixture(scope="session")
def fixture_cache() -> pathlib.Path:
    return cache_dir()


# ---- The process's shared state stays as it was ----
# Every test module runs in this one process, so a library that patches shared state
# when imported (msmodelslim assigns its own pydantic.BaseModel to every pydantic
# module) changes what the modules after it test, and only on the runs that import it:
# a fresh machine, where fixtures are built, would then test something else than a
# warm one. Such libraries run in child processes (quantisers.py); this guard names
# the module that changed the state anyway, at its collection or after its tests.

# transformers' own top-level module is left out: it is a lazy module that replaces its
# sys.modules entry with a new one when some of its submodules first load
# (processing_utils re-executes transformers/__init__.py), which is transformers' own
# doing; its real modules stand for it.
_SHARED_MODULES = ("pydantic", "pydantic.main", "openai", "httpx", "torch",
                   "transformers.configuration_utils", "transformers.modeling_utils",
                   "transformers.tokenization_utils_base", "tokenizers", "safetensors", "numpy",
                   "jinja2", "jsonschema", "gguf")


def shared_state() -> dict:
    """name -> object for the shared state the tests rely on (what is loaded now)."""
    state = {f"sys.modules[{name!r}]": sys.modules[name]
             for name in _SHARED_MODULES if name in sys.modules}
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None:
        state["pydantic.BaseModel"] = pydantic.BaseModel
        state["pydantic.main.BaseModel"] = sys.modules["pydantic.main"].BaseModel
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_default_dtype"):
        state["torch.get_default_dtype()"] = torch.get_default_dtype()
        state["torch.is_grad_enabled()"] = torch.is_grad_enabled()
        state["torch.are_deterministic_algorithms_enabled()"] = (
            torch.are_deterministic_algorithms_enabled())
        state["torch.get_default_device()"] = str(torch.get_default_device())
    return state


def state_changes(before: dict, after: dict) -> list:
    """What differs between two shared_state()s: entries gone or replaced (entries
    that appeared, libraries loaded for the first time, are not changes)."""
    return [name for name, value in before.items()
            if name not in after or (after[name] is not value and after[name] != value)]


_last_state = shared_state()  # as of the last check


def _changes_since_last_check() -> list:
    global _last_state
    now = shared_state()
    changed = state_changes(_last_state, now)
    _last_state = now
    return changed


@pytest.hookimpl(tryfirst=True)  # before pytest counts the report's outcome
def pytest_collectreport(report):
    """Importing a test module must leave the shared state as it was."""
    if report.outcome != "passed" or not report.nodeid.endswith(".py"):
        return
    changed = _changes_since_last_check()
    if changed:
        report.outcome = "failed"
        report.longrepr = (f"importing {report.nodeid} changed the test process's shared "
                           f"state: {', '.join(changed)}")


@pytest.fixture(scope="module", autouse=True)
def shared_state_unchanged(request):
    """Fails the module whose tests or fixtures (of any scope, set up for it) changed
    the shared state."""
    module = request.module.__name__
    changed = _changes_since_last_check()
    if changed:
        pytest.fail(f"setting up {module}'s fixtures changed the test process's shared "
                    f"state: {', '.join(changed)}", pytrace=False)
    yield
    changed = _changes_since_last_check()
    if changed:
        pytest.fail(f"{module} changed the test process's shared state: "
                    f"{', '.join(changed)}", pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """Session-scoped fixtures' teardowns run after the last module's check."""
    changed = _changes_since_last_check()
    if changed:
        print(f"\nthe session's fixture teardowns changed the test process's shared state: "
              f"{', '.join(changed)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    config.addinivalue_line("markers", "serve_args(*args): extra `dserve serve` flags for a "
                                       "test's server fixture")

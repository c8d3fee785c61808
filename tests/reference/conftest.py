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

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DSERVE_BUILD_DIR", REPO / "build"))


def cache_dir() -> pathlib.Path:
    root = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    d = root / "fixtures"
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

"""The Dockerfile's package lists against what the build really uses, read from dpkg
(the reference for which Debian package ships which file):
  - its build stage installs the Makefile's SERVE_APT_PACKAGES (what `make serve`
    installs), and every package that owns a file CMake found (CMakeCache.txt) is
    there or pulled in by one that is (test-only packages aside);
  - its run stage installs, directly or through their dependencies, the package of
    every shared library `ldd build/dserve` resolves (Debian's required packages,
    present in every image, aside).
`make test-container` builds the Dockerfile itself and serves a completion from it.
"""
import os
import re
import subprocess

import pytest

from conftest import REPO, build_dir

# CMake cache entries that point at a directory every -dev package shares: the owner of
# a file that the find module looked for in it is the package found.
SHARED_DIR_PROBES = {"BOOST_BEAST_INCLUDE_DIR": "boost/beast.hpp",
                     "OPENSSL_INCLUDE_DIR": "openssl/ssl.h",
                     "ICU_INCLUDE_DIR": "unicode/uchar.h"}


def makefile_list(name):
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    return set(re.search(rf"^{name} :=(.*)$", text, re.M).group(1).split())


def dockerfile_stage_packages():
    """[set of packages apt-get installs] per stage of the Dockerfile."""
    stages = []
    for line in (REPO / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        if line.startswith("FROM "):
            stages.append(set())
        m = re.search(r"apt-get install ([^&]*)", line)
        if m:
            stages[-1] |= {w for w in m.group(1).split() if not w.startswith("-")}
    return stages


def dpkg_owner(path):
    """The package that ships path (merged /usr: dpkg may know it under /lib or /usr/lib)."""
    real = os.path.realpath(path)
    candidates = [path, real] + [p[4:] if p.startswith("/usr/") else "/usr" + p for p in (path, real)]
    for candidate in candidates:
        r = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            break
    assert r.returncode == 0, f"no Debian package owns {path}: {r.stderr}"
    owners = {o.strip().split(":")[0] for o in r.stdout.splitlines()[0].split(": ")[0].split(",")}
    assert len(owners) == 1, f"{path} is owned by several packages: {owners}"
    return owners.pop()


def dpkg_field(package, field):
    return subprocess.run(["dpkg-query", "-W", "-f", "${" + field + "}", package],
                          capture_output=True, text=True).stdout


def with_dependencies(packages):
    """The packages and, recursively, everything they depend on (installed here)."""
    seen, todo = set(), list(packages)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for alternative in dpkg_field(p, "Depends").split(","):
            for dep in alternative.split("|"):
                name = dep.strip().split(" ")[0].split(":")[0]
                if name:
                    todo.append(name)
    return seen


def cmake_found_packages():
    cache = (build_dir() / "CMakeCache.txt").read_text()
    found = {}
    # /usr/local holds no Debian package: there the CUDA toolkit, which the build uses
    # when present (the CUDA backend) and the container's build stage does not have.
    for name, path in re.findall(r"^(\w+):(?:PATH|FILEPATH)=(/usr/(?!local/)\S+)$", cache, re.M):
        if name.startswith("CMAKE_") or name.endswith("_EXECUTABLE") or path.endswith(".inc"):
            continue
        if path in ("/usr/include", "/usr/lib", "/usr/share"):
            assert name in SHARED_DIR_PROBES, f"{name}={path}: add a probe file for it"
            path = f"{path}/{SHARED_DIR_PROBES[name]}"
        if name.endswith("_DIR") and os.path.isdir(path):  # a package's CMake config
            package = name[:-len("_DIR")]
            path = next(f"{path}/{c}" for c in (f"{package}Config.cmake",
                                                 f"{package.lower()}-config.cmake")
                        if os.path.exists(f"{path}/{c}"))
        found[name] = dpkg_owner(path)
    return found


def test_build_stage_installs_what_make_serve_installs():
    build, _ = dockerfile_stage_packages()
    serve = makefile_list("SERVE_APT_PACKAGES")
    assert serve - build == set(), "in SERVE_APT_PACKAGES, not in the Dockerfile's build stage"
    # The build stage's own extras: pip and its CA certificates, to fetch the model.
    assert build - serve == {"python3-pip", "ca-certificates"}


def test_every_package_cmake_found_is_installed_by_the_build_stage():
    build, _ = dockerfile_stage_packages()
    test_only = makefile_list("TEST_APT_PACKAGES")
    provided = with_dependencies(build)
    found = cmake_found_packages()
    assert len(found) >= 10, found
    missing = {name: pkg for name, pkg in found.items()
               if pkg not in provided and pkg not in with_dependencies(test_only)}
    assert not missing, f"found by CMake, not installed by the Dockerfile's build stage: {missing}"


def test_run_stage_provides_every_shared_library_of_the_binary(dserve_bin):
    _, run = dockerfile_stage_packages()
    ldd = subprocess.run(["ldd", str(dserve_bin)], capture_output=True, text=True, check=True)
    assert "not found" not in ldd.stdout, ldd.stdout
    libraries = re.findall(r"=> (/\S+)", ldd.stdout)
    assert len(libraries) >= 10, ldd.stdout
    provided = with_dependencies(run)
    missing = {}
    for lib in libraries:
        package = dpkg_owner(lib)
        if package not in provided and dpkg_field(package, "Priority") != "required":
            missing[lib] = package
    assert not missing, f"linked by dserve, not installed by the Dockerfile's run stage: {missing}"


@pytest.mark.parametrize("stage", [0, 1])
def test_dockerfile_lists_only_installed_debian_packages(stage):
    """Each listed name is a real package (installed on this Debian 12 machine by
    `make test`'s set-up, or Debian's runtime libraries of those)."""
    packages = dockerfile_stage_packages()[stage]
    unknown = [p for p in packages
               if subprocess.run(["apt-cache", "show", p], capture_output=True).returncode != 0]
    assert not unknown, unknown

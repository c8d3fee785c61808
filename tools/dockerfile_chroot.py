#!/usr/bin/env python3
"""Builds the project's Dockerfile without a Docker daemon, in chroots of clean Debian
roots made by debootstrap, and checks the image it gives: dserve starts as the image's
ENTRYPOINT + CMD (as its USER, in a network namespace of its own, as a container
would), answers /health and a completion, and the HEALTHCHECK passes.

    tools/dockerfile_chroot.py [--dockerfile Dockerfile] [--context .] --cache DIR
                               [--cache-mount TARGET=HOST_DIR]...

Supported: FROM debian:12[-slim] [AS name] (debootstrap --variant=minbase bookworm, as
Debian's official images are made), ARG, ENV, WORKDIR, RUN (with
--mount=type=cache,target=T, bound to the --cache-mount given for T or to a
directory in the cache), COPY [--from=stage] [--chown=u:g], USER, EXPOSE,
HEALTHCHECK CMD, ENTRYPOINT, CMD; anything else is an error. Each stage's
instructions up to its first COPY (its package installs) are cached as a root keyed
by their text, so an unchanged Dockerfile costs only its COPY and later steps. A
CA bundle of the host (for a proxy that re-signs TLS) is handed to RUN steps as
PIP_CERT, as `docker build --secret` would; it is not left in the image.

Needs root, debootstrap, unshare, ip, curl. Python's standard library only.
"""
import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SUITES = {"debian:12": "bookworm", "debian:12-slim": "bookworm", "debian:bookworm": "bookworm",
          "debian:bookworm-slim": "bookworm"}
MIRROR = "http://deb.debian.org/debian"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")


class DockerfileError(Exception):
    pass


def log(msg):
    print(f"[dockerfile_chroot] {msg}", flush=True)


def sh(args, **kw):
    return subprocess.run([str(a) for a in args], check=True, **kw)


# ---- parsing ----

def logical_lines(text):
    """(line number, instruction text) with continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        raise DockerfileError(f"line {start}: continuation at the end of the file")
    return out


def parse(text):
    """[{name, base, steps: [(line, keyword, flags, rest)]}] in order."""
    stages = []
    for line, inst in logical_lines(text):
        keyword, _, rest = inst.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        flags = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags.setdefault(name, []).append(value)
            rest = rest.strip()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            if not m or m.group(1) not in SUITES:
                raise DockerfileError(f"line {line}: FROM {rest}: only {sorted(SUITES)}")
            stages.append({"name": m.group(2) or str(len(stages)), "base": m.group(1), "steps": []})
        elif not stages:
            if keyword != "ARG":
                raise DockerfileError(f"line {line}: {keyword} before FROM")
        elif keyword in ("ARG", "ENV", "WORKDIR", "RUN", "COPY", "USER", "EXPOSE", "HEALTHCHECK",
                         "ENTRYPOINT", "CMD"):
            stages[-1]["steps"].append((line, keyword, flags, rest))
        else:
            raise DockerfileError(f"line {line}: {keyword} is not supported here")
    if not stages:
        raise DockerfileError("no FROM")
    return stages


def exec_form(rest):
    """A JSON array (exec form) or a shell string (shell form) as argv."""
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


def assignments(rest):
    """ENV/ARG text as {name: value} (ENV k=v k2=v2, ENV k v, ARG k[=v])."""
    parts = shlex.split(rest)
    if len(parts) >= 2 and "=" not in parts[0]:
        return {parts[0]: " ".join(parts[1:])}
    return dict((p.split("=", 1) + [""])[:2] for p in parts)


# ---- roots ----

def base_root(cache, base):
    """A cached clean root for a FROM image."""
    suite = SUITES[base]
    d = cache / f"base-{suite}-minbase"
    if not (d / ".done").exists():
        remove_root(d)
        log(f"debootstrap --variant=minbase {suite}")
        sh(["debootstrap", "--variant=minbase", suite, d, MIRROR], stdout=subprocess.DEVNULL)
        (d / ".done").write_text("")
    return d


def nothing_mounted_under(path):
    """Refuses to go on while anything is mounted under path (deleting a root with
    /dev still bound in it would delete the host's /dev)."""
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f]
    inside = [m for m in mounts if m == path or m.startswith(path + "/")]
    if inside:
        raise RuntimeError(f"still mounted under {path}: {inside}")


def remove_root(path):
    if os.path.exists(path):
        nothing_mounted_under(path)
        shutil.rmtree(path)


def copy_root(src, dst):
    remove_root(dst)
    sh(["cp", "-a", src, dst])


@contextlib.contextmanager
def mounted(root, binds):
    """/proc, /dev and the given (host dir, target) binds mounted in root."""
    done = []
    try:
        for kind, src, target in [("proc", "proc", "/proc"), ("bind", "/dev", "/dev")] + \
                [("bind", s, t) for s, t in binds]:
            where = root / target.lstrip("/")
            where.mkdir(parents=True, exist_ok=True)
            args = ["mount", "-t", "proc", "proc", where] if kind == "proc" else \
                ["mount", "--bind", src, where]
            sh(args)
            done.append(where)
        yield
    finally:
        for where in reversed(done):
            subprocess.run(["umount", "-l", str(where)], check=False)


class Stage:
    """One stage's root and the state its instructions build."""

    def __init__(self, root):
        self.root = root
        self.env = {"PATH": DEFAULT_PATH, "HOME": "/root"}
        self.args = {}
        self.workdir, self.user = "/", "0"
        self.meta = {}

    def run(self, flags, command, cache, cache_mounts):
        binds = []
        for mount in flags.get("mount", []):
            opts = dict(o.split("=", 1) for o in mount.split(","))
            if opts.get("type") != "cache":
                raise DockerfileError(f"RUN --mount={mount}: only type=cache")
            target = opts["target"]
            host = cache_mounts.get(target) or cache / "mounts" / re.sub(r"\W", "_", target)
            pathlib.Path(host).mkdir(parents=True, exist_ok=True)
            binds.append((host, target))
        env = {**self.args, **self.env}
        if HOST_CA.exists():
            secret = self.root / "run" / "host-ca-certificates.crt"
            secret.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(HOST_CA, secret)
            env["PIP_CERT"] = "/run/host-ca-certificates.crt"
        shutil.copy("/etc/resolv.conf", self.root / "etc" / "resolv.conf")
        script = f"cd {shlex.quote(self.workdir)} && {command}"
        try:
            with mounted(self.root, binds):
                sh(["chroot", "--userspec", f"{self.user}:{self.user}", self.root,
                    "/bin/sh", "-c", script], env=env)
        finally:
            (self.root / "run" / "host-ca-certificates.crt").unlink(missing_ok=True)

    def copy(self, flags, rest, context, stages):
        """Docker's COPY: a directory's contents go into dest; a file goes to dest, or
        into it when dest ends in / or is a directory."""
        *sources, dest = shlex.split(rest)
        src_root = stages[flags["from"][0]].root if "from" in flags else context
        dest_path = self.root / os.path.join(self.workdir, dest).lstrip("/")
        for s in sources:
            if src_root == context and any(fnmatch.fnmatch(s.strip("/"), p) for p in IGNORED):
                raise DockerfileError(f"COPY {s}: excluded by .dockerignore")
            src = src_root / s.lstrip("/")
            if src.is_dir():
                target = dest_path
                shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
            elif src.is_file():
                into = dest.endswith("/") or dest_path.is_dir() or len(sources) > 1
                target = dest_path / src.name if into else dest_path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
            else:
                raise DockerfileError(f"COPY {s}: not found in {src_root}")
            if "chown" in flags:
                sh(["chroot", self.root, "chown", "-R", flags["chown"][0],
                    "/" + str(target.relative_to(self.root))])

    def apply(self, step, context, stages, cache, cache_mounts):
        line, keyword, flags, rest = step
        if keyword == "ARG":
            self.args.update({k: v for k, v in assignments(rest).items()})
        elif keyword == "ENV":
            self.env.update(assignments(rest))
        elif keyword == "WORKDIR":
            self.workdir = os.path.join(self.workdir, rest)
            (self.root / self.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif keyword == "RUN":
            self.run(flags, rest, cache, cache_mounts)
        elif keyword == "COPY":
            self.copy(flags, rest, context, stages)
        elif keyword == "USER":
            self.user = rest
        else:  # EXPOSE, HEALTHCHECK, ENTRYPOINT, CMD: the image's metadata
            self.meta[keyword] = (flags, rest)


IGNORED = []  # .dockerignore's patterns, read in main()


def build(stages_spec, context, cache, work, cache_mounts):
    """Runs every stage; returns the last one."""
    stages = {}
    for spec in stages_spec:
        steps = spec["steps"]
        first_copy = next((i for i, s in enumerate(steps) if s[1] == "COPY"), len(steps))
        key = hashlib.sha256(json.dumps([spec["base"], [s[1:] for s in steps[:first_copy]]])
                             .encode()).hexdigest()[:16]
        layer = cache / f"layer-{key}"
        stage = Stage(work / spec["name"])
        if (layer / ".done").exists():
            log(f"stage {spec['name']}: packages cached ({layer.name})")
            copy_root(layer, stage.root)
            replay = [s for s in steps[:first_copy] if s[1] != "RUN"]
        else:
            copy_root(base_root(cache, spec["base"]), stage.root)
            replay = steps[:first_copy]
        for step in replay:
            log(f"stage {spec['name']}, line {step[0]}: {step[1]} {step[3][:80]}")
            stage.apply(step, context, stages, cache, cache_mounts)
        if not (layer / ".done").exists():
            copy_root(stage.root, layer)
            (layer / ".done").write_text("")
        for step in steps[first_copy:]:
            log(f"stage {spec['name']}, line {step[0]}: {step[1]} {step[3][:80]}")
            stage.apply(step, context, stages, cache, cache_mounts)
        stages[spec["name"]] = stage
    return stage


# ---- the image's check ----

CHECK_SCRIPT = r"""
set -e
ip link set lo up
"$@" > "$LOG" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for i in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 $server 2>/dev/null || { echo "dserve exited before it was healthy"; exit 1; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health"
echo
curl -sf --max-time 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'"$MODEL"'", "prompt": "The capital of France is", "max_tokens": 8}' > "$OUT"
eval chroot "$ROOT" "$HEALTHCHECK"
echo "healthcheck passed"
"""


def check_image(stage):
    """Starts the image's command in a network namespace of its own; True when it
    answered /health and a completion and its HEALTHCHECK passed."""
    argv = exec_form(stage.meta["ENTRYPOINT"][1]) + exec_form(stage.meta["CMD"][1])
    port = stage.meta["EXPOSE"][1].split("/")[0]
    model = argv[argv.index("--served-model-name") + 1]
    health = stage.meta["HEALTHCHECK"][1]
    if not health.startswith("CMD "):
        raise DockerfileError("HEALTHCHECK: expected CMD ...")
    health_argv = exec_form(health[4:].strip())
    with tempfile.TemporaryDirectory() as tmp:
        out, server_log = pathlib.Path(tmp) / "completion.json", pathlib.Path(tmp) / "serve.log"
        env = {**os.environ, "PORT": port, "MODEL": model, "OUT": str(out), "LOG": str(server_log),
               "ROOT": str(stage.root), "HEALTHCHECK": " ".join(shlex.quote(a) for a in health_argv)}
        user = stage.user
        with mounted(stage.root, []):
            r = subprocess.run(["unshare", "--net", "bash", "-c", CHECK_SCRIPT, "check",
                                "chroot", "--userspec", f"{user}:{user}", str(stage.root),
                                *argv], env=env, capture_output=True, text=True, timeout=900)
        print(r.stdout, r.stderr, sep="\n")
        if r.returncode != 0:
            print("serve log:\n" + (server_log.read_text()[-4000:] if server_log.exists() else ""))
            return False
        body = json.loads(out.read_text())
        text = body["choices"][0]["text"]
        log(f"completion: {text!r}, usage {body['usage']}")
        return body["usage"]["completion_tokens"] >= 1 and body["model"] == model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dockerfile", default="Dockerfile", type=pathlib.Path)
    p.add_argument("--context", default=".", type=pathlib.Path)
    p.add_argument("--cache", required=True, type=pathlib.Path)
    p.add_argument("--cache-mount", action="append", default=[],
                   help="TARGET=HOST_DIR: a RUN --mount=type=cache target bound to a host dir")
    a = p.parse_args()
    context = a.context.resolve()
    ignore = context / ".dockerignore"
    if ignore.exists():
        IGNORED.extend(l.strip() for l in ignore.read_text().splitlines()
                       if l.strip() and not l.startswith("#"))
    cache = a.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    cache_mounts = dict(m.split("=", 1) for m in a.cache_mount)
    started = time.monotonic()
    spec = parse(a.dockerfile.read_text())
    work = pathlib.Path(tempfile.mkdtemp(prefix="work-", dir=cache))
    try:
        image = build(spec, context, cache, work, cache_mounts)
        log(f"built in {time.monotonic() - started:.0f} s; checking the image")
        ok = check_image(image)
    finally:
        remove_root(work)
    log(("image check passed" if ok else "image check FAILED") +
        f" ({time.monotonic() - started:.0f} s in all)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""deploy_container_packages.py — the container images install what CMake and the binary need,
checked without building them (CI has no podman: tests/integration/deploy_container.sh skips).

For each of deploy/container/Containerfile and Containerfile.cpu:
  * every FROM names its base image by digest (`image:tag@sha256:<64 hex>`);
  * the build stage installs the Debian package of every REQUIRED lookup of the top-level
    CMakeLists.txt: pkg_check_modules(... REQUIRED ... module) -> the package owning the
    module's .pc file (dpkg -S), find_library/find_path(... REQUIRED) -> the package owning
    the file found, find_package(X REQUIRED) through the small table below (a new one fails
    here until it is added);
  * the runtime stage installs the package of every shared library the built `medley`
    ($MEDLEY_BIN, a CPU or CUDA build) needs (readelf NEEDED -> ldconfig path -> dpkg -S), except
    the C library's (IN_BASE: in every Debian/Ubuntu base image) and the CUDA toolkit's
    (CUDA_RUNTIME: the GPU image's nvidia/cuda base has them).
Package names are this Debian 12's; Ubuntu 22.04 (the CUDA image) uses the same names for
these libraries. Label unit: a second or two.
"""
import glob
import os
import re
import subprocess
import sys

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FILES = ["deploy/container/Containerfile", "deploy/container/Containerfile.cpu"]
# find_package(NAME REQUIRED): how the build stage provides it. None: nothing to install
# (libc, or the CUDA devel base image for the CUDA image only).
FIND_PACKAGE = {
    "PkgConfig": ["pkg-config", "pkgconf"],
    "Threads": None,
    "ZLIB": ["zlib1g-dev"],
    "CUDAToolkit": None,
}
# Libraries every Debian and Ubuntu base image has (the C runtime).
IN_BASE = {"libc6", "libgcc-s1"}
# The CUDA toolkit's own libraries, which a CUDA build of medley (what CI builds where nvcc
# is) needs: the GPU image's nvidia/cuda runtime base provides them, and the CPU image builds
# with MEDLEY_CUDA=OFF, so no Debian package is asked for.
CUDA_RUNTIME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nccl|cuda)\.so")
# A sanitizer build's runtimes (scripts/test.sh runs this test under ASan+UBSan too): never
# in an image, which builds without -DMEDLEY_SANITIZE.
SANITIZER = re.compile(r"^lib(asan|ubsan|tsan|lsan)\.so")
errors = []


def fail(msg):
    errors.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def owner(path):
    """The Debian package that installed path, without :arch."""
    r = run("dpkg", "-S", path)
    if r.returncode:
        r = run("dpkg", "-S", os.path.realpath(path))
    if r.returncode:
        return None
    return r.stdout.split(":")[0].split(",")[0].strip()


def cmake_required():
    """[(what, [acceptable packages])] for the REQUIRED lookups of CMakeLists.txt."""
    text = open(os.path.join(SRC, "CMakeLists.txt"), encoding="utf-8").read()
    text = re.sub(r"#[^\n]*", "", text)
    out = []
    for m in re.finditer(r"pkg_check_modules\s*\(([^)]*)\)", text):
        args = m.group(1).split()
        if "REQUIRED" not in args:
            continue
        mods = [a for a in args[1:] if a not in ("REQUIRED", "IMPORTED_TARGET", "QUIET",
                                                  "GLOBAL", "NO_CMAKE_PATH")]
        for mod in mods:
            mod = re.split(r"[<>=]", mod)[0]
            r = run("pkg-config", "--variable=pcfiledir", mod)
            pc = os.path.join(r.stdout.strip(), mod + ".pc")
            pkg = owner(pc) if r.returncode == 0 else None
            if not pkg:
                fail(f"CMakeLists.txt needs pkg-config module {mod}: no Debian package owns it here")
                continue
            out.append((f"pkg_check_modules {mod}", [pkg]))
    for m in re.finditer(r"find_library\s*\(\s*(\w+)\s+([^)]*)\)", text):
        args = m.group(2).split()
        if "REQUIRED" not in args:
            continue
        name = args[0]
        hits = sorted(glob.glob(f"/usr/lib/*/lib{name}.so") + glob.glob(f"/usr/lib/lib{name}.so"))
        pkg = owner(hits[0]) if hits else None
        if not pkg:
            fail(f"find_library {name}: lib{name}.so not found here (is its -dev package installed?)")
            continue
        out.append((f"find_library {name}", [pkg]))
    for m in re.finditer(r"find_path\s*\(\s*(\w+)\s+([^)]*)\)", text):
        args = m.group(2).split()
        if "REQUIRED" not in args:
            continue
        pkg = owner(os.path.join("/usr/include", args[0]))
        if not pkg:
            fail(f"find_path {args[0]}: no Debian package owns /usr/include/{args[0]} here")
            continue
        out.append((f"find_path {args[0]}", [pkg]))
    for m in re.finditer(r"find_package\s*\(\s*(\w+)([^)]*)\)", text):
        name = m.group(1)
        if name not in FIND_PACKAGE:
            fail(f"find_package({name}) in CMakeLists.txt is not in this test's FIND_PACKAGE table:"
                 " say which Debian package provides it")
            continue
        if FIND_PACKAGE[name]:
            out.append((f"find_package {name}", FIND_PACKAGE[name]))
    return out


def runtime_required():
    """[(library, package)] for the NEEDED libraries of $MEDLEY_BIN outside IN_BASE."""
    binary = os.environ.get("MEDLEY_BIN")
    if not binary or not os.path.exists(binary):
        fail("MEDLEY_BIN is not set to the built medley (ctest sets it)")
        return []
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", binary).stdout)
    if not needed:
        fail(f"readelf -d {binary} lists no NEEDED libraries")
    paths = {}
    for line in run("ldconfig", "-p").stdout.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "64" in m.group(2):
            paths.setdefault(m.group(1), m.group(3))
    out = []
    for lib in needed:
        if CUDA_RUNTIME.match(lib) or SANITIZER.match(lib):
            continue
        path = paths.get(lib)
        pkg = owner(path) if path else None
        if not pkg:
            fail(f"{binary} needs {lib}: not found by ldconfig or not from a Debian package")
            continue
        if pkg not in IN_BASE:
            out.append((lib, pkg))
    return out


def stages(path):
    """[(from_line, set of apt-get installed packages)] per FROM stage of a Containerfile."""
    text = open(os.path.join(SRC, path), encoding="utf-8").read().replace("\\\n", " ")
    result = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("FROM "):
            result.append([s, set()])
        elif s.startswith("RUN ") and result:
            for cmd in re.split(r"&&|;", s[4:]):
                if "apt-get install" in cmd:
                    words = cmd.split("install", 1)[1].split()
                    result[-1][1].update(w for w in words if not w.startswith("-"))
    return result


def main():
    build_needs = cmake_required()
    run_needs = runtime_required()
    for f in FILES:
        st = stages(f)
        if len(st) < 2:
            fail(f"{f}: expected a build stage and a runtime stage, found {len(st)} FROM")
            continue
        for from_line, _ in st:
            if not re.search(r"@sha256:[0-9a-f]{64}(\s|$)", from_line):
                fail(f"{f}: '{from_line}' does not pin its base image by digest (@sha256:...)")
        build_pkgs, run_pkgs = st[0][1], st[-1][1]
        for what, pkgs in build_needs:
            if not any(p in build_pkgs for p in pkgs):
                fail(f"{f}: the build stage does not install {' or '.join(pkgs)} ({what} REQUIRED"
                     " in CMakeLists.txt)")
        for lib, pkg in run_needs:
            if pkg not in run_pkgs:
                fail(f"{f}: the runtime stage does not install {pkg} (medley needs {lib})")
        print(f"{f}: {len(st)} stages, build {len(build_needs)} lookups and runtime "
              f"{len(run_needs)} libraries checked")
    if errors:
        print(f"deploy_container_packages: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print("deploy_container_packages: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

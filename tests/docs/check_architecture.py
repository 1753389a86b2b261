#!/usr/bin/env python3
"""Checks that docs/architecture.md is true of the tree it sits in.

  1. Every product source file (.c .h .cu .cuh .cc under the product folders) has a line in
     the doc's file tables (each table headed "### <folder>/", names relative to it), every
     file those tables name exists, and none is named twice.
  2. The dependency table ("## Dependencies between folders") states, for each folder, the
     folders its `#include "x/y.h"` lines reach and the outside libraries its CMake target
     links; both must match the tree exactly.
  3. The folder include graph has no cycle. It is printed, leaves first. An edge the table
     marks "(back edge: why)" is left out of the cycle check but must still exist, so the
     mark goes when the code loses the edge.

Usage: check_architecture.py [REPO_ROOT]   (default: two folders above this file)
Exit 0 when the doc is true, 1 with one line per finding naming the file or folder, 2 when
the doc cannot be read. Standard library only; the files from `git ls-files` (tracked, and
untracked but not ignored) in a git checkout, a walk of the tree otherwise.
"""

import fnmatch
import os
import re
import subprocess
import sys

PRODUCT = ("cli", "common", "engine", "kernels", "queue", "worker", "scheduler", "dashboard",
           "api")
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cc")
DOC = "docs/architecture.md"

# CMake link items -> the library names the doc uses. medley_* targets are folders (checked
# through the includes); anything not named here is reported so the table grows with CMake.
CMAKE_LIBS = {
    "PkgConfig::JANSSON": "jansson",
    "PkgConfig::HIREDIS": "hiredis",
    "PkgConfig::CRYPTO": "libcrypto",
    "PkgConfig::PCRE2": "pcre2",
    "PkgConfig::UTF8PROC": "utf8proc",
    "PkgConfig::MICROHTTPD": "libmicrohttpd",
    "PkgConfig::MD_DASH_MHD": "libmicrohttpd",
    "ZLIB::ZLIB": "zlib",
    "PkgConfig::LIBCRYPTO": "libcrypto",
    "Threads::Threads": "pthreads",
    "CUDA::cudart": "cudart",
    "CUDA::cublas": "cublas",
    "CUDA::cublasLt": "cublasLt",
    "${GLPK_LIB}": "glpk",
    "${CMAKE_DL_LIBS}": "dl",
    "m": "libm",
}
LINK_KEYWORDS = {"PUBLIC", "PRIVATE", "INTERFACE"}


def tracked_files(root):
    """Repository-relative paths of the tracked files and of the new ones git does not ignore
    (so a file is flagged before its commit), or of every file outside .git and build folders
    when root is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True)
        files = [f for f in out.stdout.decode("utf-8", "replace").split("\0") if f]
        if files:
            return [f for f in files if os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        subdirs[:] = [s for s in subdirs
                      if not s.startswith(".") and not (rel == "." and s.startswith("build"))]
        for n in names:
            files.append(os.path.normpath(os.path.join(rel, n)))
    return files


def strip_md(cell):
    return cell.strip().strip("`").strip()


def parse_doc(text):
    """-> (listed, deps, backs, errors). listed: [(path, line)] from the file tables under
    "## Files"; deps: {folder: (set of folders, set of libs, line)}; backs: the edges the
    table marks "(back edge ...)", known cycles the doc owns up to."""
    listed, deps, backs, errors = [], {}, set(), []
    section, folder = None, None
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section = line[3:].strip().lower()
            folder = None
            continue
        if line.startswith("### ") and section == "files":
            m = re.match(r"###\s+(\S+)/", line)
            folder = m.group(1) if m else None
            continue
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = line.strip().strip("|").split("|")
        if section == "files" and folder:
            if cells[0].strip() == "file":
                continue
            for name in re.findall(r"`([^`]+)`", cells[0]):
                listed.append((os.path.normpath(os.path.join(folder, name.rstrip("/"))), no))
        elif section and section.startswith("dependencies between folders"):
            if len(cells) < 3 or strip_md(cells[0]) in ("folder", ""):
                continue
            name = strip_md(cells[0]).split()[0].rstrip("/")
            if name in deps:
                errors.append(f"{DOC}:{no}: folder {name} has two rows in the dependency table")

            def names(cell):
                out, back = set(), set()
                for item in cell.split(","):
                    n = strip_md(re.sub(r"\(.*?\)", "", item))
                    if not n or n in ("—", "-", "nothing"):
                        continue
                    out.add(n.rstrip("/"))
                    if re.search(r"\(\s*back edge", item):
                        back.add(n.rstrip("/"))
                return out, back

            folders_to, back = names(cells[1])
            deps[name] = (folders_to, names(cells[2])[0], no)
            backs.update((name, b) for b in back)
    return listed, deps, backs, errors


def owner(path, folders):
    """The deepest folder of the dependency table holding path, or None."""
    d = os.path.dirname(path)
    while d:
        if d in folders:
            return d
        d = os.path.dirname(d)
    return None


INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def include_graph(root, sources, folders, tracked):
    """-> ({folder: {folder: [example 'file -> header']}}, errors)."""
    graph = {f: {} for f in folders}
    errors = []
    for src in sources:
        frm = owner(src, folders)
        if frm is None:
            continue  # reported as a folder without a row
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            local = os.path.normpath(os.path.join(os.path.dirname(src), inc))
            target = local if local in tracked else os.path.normpath(inc)
            if target not in tracked:
                errors.append(f'{src}: #include "{inc}" names no file of the tree')
                continue
            to = owner(target, folders)
            if to is None:
                errors.append(f'{src}: #include "{inc}" reaches {os.path.dirname(target)}/, '
                              f"which has no row in the dependency table of {DOC}")
                continue
            if to != frm:
                graph[frm].setdefault(to, []).append(f"{src} -> {target}")
    return graph, errors


def cmake_libs(root, folder):
    """-> (libs, cmake file, unknown items) for the CMakeLists.txt that builds folder: its own,
    or the nearest one above it (kernels/cpu is compiled by kernels/CMakeLists.txt)."""
    d = folder
    while d and not os.path.exists(os.path.join(root, d, "CMakeLists.txt")):
        d = os.path.dirname(d)
    if not d:
        return set(), None, []
    path = os.path.join(d, "CMakeLists.txt")
    with open(os.path.join(root, path), encoding="utf-8") as fh:
        text = re.sub(r"#[^\n]*", "", fh.read())
    libs, unknown = set(), []
    for args in re.findall(r"target_link_libraries\s*\(([^)]*)\)", text):
        for item in args.split()[1:]:
            if item in LINK_KEYWORDS or item.startswith("medley_"):
                continue
            if item in CMAKE_LIBS:
                libs.add(CMAKE_LIBS[item])
            else:
                unknown.append(item)
    return libs, path, unknown


def cycle(graph):
    """One cycle of the graph as a list of folders, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, {})):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def layers(graph):
    """Folders by depth: 0 = includes nothing of medley, k = includes only layers < k."""
    depth = {}

    def d(n):
        if n not in depth:
            depth[n] = 0
            depth[n] = 1 + max((d(m) for m in graph[n]), default=-1)
        return depth[n]

    for n in graph:
        d(n)
    return depth


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    try:
        with open(os.path.join(root, DOC), encoding="utf-8") as fh:
            doc = fh.read()
    except OSError as e:
        print(f"check_architecture: cannot read {os.path.join(root, DOC)}: {e.strerror}")
        return 2
    files = tracked_files(root)
    tracked = set(files)
    tracked_dirs = {os.path.dirname(f) for f in files}
    for f in files:
        d = os.path.dirname(f)
        while d:
            tracked_dirs.add(d)
            d = os.path.dirname(d)
    sources = sorted(f for f in files
                     if f.split("/")[0] in PRODUCT and f.endswith(SOURCE_EXT))
    listed, deps, backs, errors = parse_doc(doc)
    if not listed:
        errors.append(f"{DOC}: no file tables found under '## Files'")
    if not deps:
        errors.append(f"{DOC}: no dependency table found under '## Dependencies between folders'")

    # 1. Files: every product source listed, every listed name present.
    listed_paths, first_line = set(), {}
    for path, no in listed:
        if path in first_line:
            errors.append(f"{DOC}:{no}: {path} is listed twice (also line {first_line[path]})")
        first_line.setdefault(path, no)
        if any(c in path for c in "*?["):
            if not fnmatch.filter(files, path):
                errors.append(f"{DOC}:{no}: {path} matches no file of the tree")
            listed_paths.update(fnmatch.filter(files, path))
        elif path in tracked or path in tracked_dirs:
            listed_paths.add(path)
        else:
            errors.append(f"{DOC}:{no}: {path} is listed but does not exist")
    for src in sources:
        if src not in listed_paths:
            errors.append(f"{src}: product source file missing from the file tables of {DOC}")

    # 2. Dependencies: rows for exactly the folders that hold product sources.
    folders = set(deps)
    for name, (_, _, no) in sorted(deps.items()):
        if name not in tracked_dirs:
            errors.append(f"{DOC}:{no}: dependency row for {name}/, which does not exist")
    rowless = {}
    for src in sources:
        if owner(src, folders) is None:
            rowless.setdefault(os.path.dirname(src), []).append(os.path.basename(src))
    for d, names in sorted(rowless.items()):
        errors.append(f"{d}/: holds {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} "
                      f"but has no row in the dependency table of {DOC}")
    graph, inc_errors = include_graph(root, sources, folders, tracked)
    errors += inc_errors
    for name in sorted(folders):
        stated, stated_libs, no = deps[name]
        actual = set(graph[name])
        for f in sorted(actual - stated):
            why = graph[name][f][0]
            errors.append(f"{name}/: includes {f}/ ({why}) but {DOC}:{no} does not say so")
        for f in sorted(stated - actual):
            errors.append(f"{name}/: {DOC}:{no} says it includes {f}/, no #include does")
        compiled = any(owner(f, folders) == name and f.endswith((".c", ".cu", ".cc"))
                       for f in sources)
        # A folder of headers only links nothing of its own.
        libs, cmake, unknown = cmake_libs(root, name) if compiled else (set(), None, [])
        for item in unknown:
            errors.append(f"{cmake}: links {item}, which check_architecture.py cannot name "
                          f"(add it to CMAKE_LIBS)")
        for lib in sorted(libs - stated_libs):
            errors.append(f"{name}/: {cmake} links {lib} but {DOC}:{no} does not say so")
        for lib in sorted(stated_libs - libs):
            errors.append(f"{name}/: {DOC}:{no} says it links {lib}, "
                          f"{cmake or 'nothing (headers only)'} does not")

    # 3. No cycle but the back edges the doc states (each must still exist, checked above, so
    # the doc is corrected when the code loses one); print the graph leaves first.
    for frm, to in sorted(backs):
        if to in graph.get(frm, {}):
            print(f"known back edge {frm}/ -> {to}/ (stated in {DOC}): "
                  + "; ".join(graph[frm][to]))
    graph = {n: {m: w for m, w in e.items() if (n, m) not in backs} for n, e in graph.items()}
    loop = cycle(graph)
    if loop:
        errors.append("include cycle between folders: " + " -> ".join(loop))
    else:
        depth = layers(graph)
        print("folder include graph, leaves first ([n]: the longest include path down to common/; each folder includes only folders of a lower n):")
        for name in sorted(graph, key=lambda n: (depth[n], n)):
            to = ", ".join(sorted(graph[name])) or "nothing of medley"
            print(f"  [{depth[name]}] {name + '/':18} -> {to}")
    print(f"{len(sources)} product source files, {len(listed_paths)} paths listed, "
          f"{len(folders)} folders in the dependency table")
    for e in errors:
        print("FAIL " + e)
    if errors:
        print(f"{len(errors)} finding(s): {DOC} does not match the tree")
        return 1
    print(f"{DOC} matches the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""redis-acl.py — the Redis commands medley sends, read from its C source, and the check that
the ACL user in deploy/redis/users.acl allows exactly those.

Where commands come from (common/ queue/ worker/ cli/ scheduler/ dashboard/ api/, *.c):
  - format strings of md_redis_cmd / redisCommand / redisAppendCommand: the first word, and
    the second for a container command (SCRIPT LOAD, XGROUP CREATE, XINFO GROUPS);
  - argv arrays of md_redis_cmd_argv / redisCommandArgv / redisAppendCommandArgv: the literal
    at the index the call starts from (`argv` or `argv + 1`), found in the calling function as
    an initializer `{"XADD", ...}`, an assignment `argv[1] = "XDEL"`, or the first
    `argv[k++] = "XCLAIM"` after `k = 0`;
  - Lua: redis.call / redis.pcall in any string literal (scripts run with the caller's ACL).
A call whose command is not a literal (a %s in the command word, a format string or argv
element that is a variable) is an error naming file:line, so a command built at run time
cannot slip past the check. The two wrappers in common/redis.c pass their caller's format
and argv through and are not call sites.

  scripts/redis-acl.py                 the rules, one a line (+hset, +script|load, ...)
  scripts/redis-acl.py --where         each rule with the places that need it
  scripts/redis-acl.py --check FILE    exit 1 unless FILE's `user medley` line allows exactly
                                       those (plus its key/channel patterns; see below)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ("common", "queue", "worker", "cli", "scheduler", "dashboard", "api")
# Redis 7.0 commands whose ACL rules name a subcommand (`+xgroup|create`). The integration test
# queue_tls_acl checks this list against the server's COMMAND DOCS.
CONTAINERS = {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "FUNCTION", "LATENCY", "MEMORY",
              "MODULE", "OBJECT", "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO"}
FMT_CALLS = {"md_redis_cmd": 2, "redisCommand": 1, "redisAppendCommand": 1}  # name: fmt index
ARGV_CALLS = {"md_redis_cmd_argv": 2, "redisCommandArgv": 2, "redisAppendCommandArgv": 2}
WRAPPERS = {("common/redis.c", "md_redis_cmd"), ("common/redis.c", "md_redis_cmd_argv")}
# Functions whose commands go to a Sentinel (sentinel:// URLs), not to the data Redis: the
# Sentinel's own ACL covers them (docs/operations.md), the medley user's does not.
TO_SENTINEL = {("common/redis_dial.c", "ask")}
LUA_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
STRING = r'"(?:[^"\\\n]|\\.)*"'


class SourceError(Exception):
    pass


def strip_comments(src):
    """src with comments blanked (newlines kept, so offsets and line numbers still hold)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src[i] in "\"'":
            m = re.compile(r"%s(?:[^%s\\\n]|\\.)*%s" % (src[i], src[i], src[i])).match(src, i)
            j = m.end() if m else i + 1
            out.append(src[i:j])
            i = j
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def call_args(src, open_paren):
    """The top-level arguments of the call whose '(' is at open_paren, as source text."""
    args, depth, start, i = [], 0, open_paren + 1, open_paren
    while i < len(src):
        ch = src[i]
        if ch == '"' or ch == "'":
            i = re.compile(r"%s(?:[^%s\\\n]|\\.)*%s" % (ch, ch, ch)).match(src, i).end()
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(src[start:i].strip())
                return args
        elif ch == "," and depth == 1:
            args.append(src[start:i].strip())
            start = i + 1
        i += 1
    raise SourceError("unclosed call")


def literal(expr):
    """The C string an expression of only (concatenated) string literals stands for, else None."""
    parts = re.findall(STRING, expr)
    if not parts or re.sub(STRING, "", expr).strip():
        return None
    return "".join(bytes(p[1:-1], "utf-8").decode("unicode_escape") for p in parts)


def enclosing_function(src, pos):
    """(name, body start) of the function definition that contains pos."""
    best = None
    for m in re.finditer(r"^[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;{]*?\)\s*\{", src, re.M | re.S):
        if m.start() > pos:
            break
        best = (m.group(1), m.end())
    return best or ("", 0)


def rule(words, where):
    """`+cmd` or `+cmd|sub` for a command given as its words."""
    if not words or not re.fullmatch(r"[A-Za-z]+", words[0]):
        raise SourceError("%s: the command name is not a literal word (%r)" % (where, words[:1]))
    cmd = words[0].upper()
    if cmd in CONTAINERS:
        if len(words) < 2 or not re.fullmatch(r"[A-Za-z]+", words[1]):
            raise SourceError("%s: %s needs a literal subcommand" % (where, cmd))
        return "+%s|%s" % (cmd.lower(), words[1].lower())
    return "+" + cmd.lower()


def argv_element(body, name, index, where):
    """The literal a function body stores at name[index] last before the call (body ends at
    the call): from an initializer, an assignment, or argv[k++] after `k = 0` (index 0)."""
    stores = []  # (position, literal or None)
    for m in re.finditer(r"\b%s\s*\[\s*\]\s*=\s*\{" % re.escape(name), body):
        elems = call_args(body, m.end() - 1)
        if index < len(elems):
            stores.append((m.start(), literal(elems[index])))
    for m in re.finditer(r"\b%s\s*\[\s*%d\s*\]\s*=\s*([^;=][^;]*);" % (re.escape(name), index),
                         body):
        stores.append((m.start(), literal(m.group(1))))
    if index == 0:
        for m in re.finditer(r"\b(\w+)\s*=\s*0\s*;", body):
            inc = re.compile(r"\b%s\s*\[\s*%s\+\+\s*\]\s*=\s*([^;]+);" % (
                re.escape(name), m.group(1))).search(body, m.end())
            if inc and not re.search(r"\b%s\s*=[^=]" % m.group(1), body[m.end():inc.start()]):
                stores.append((inc.start(), literal(inc.group(1))))
    if not stores:
        raise SourceError("%s: cannot find what %s[%d] holds" % (where, name, index))
    found = max(stores)[1]
    if found is None:
        raise SourceError("%s: %s[%d] is not a literal" % (where, name, index))
    return found


def scan_file(root, rel, rules):
    with open(os.path.join(root, rel)) as f:
        raw = f.read()
    src = strip_comments(raw)
    line = lambda pos: src.count("\n", 0, pos) + 1
    known = set(FMT_CALLS) | set(ARGV_CALLS)
    for m in re.finditer(r"\b(redis\w*Command\w*|md_redis_cmd\w*)\s*\(", src):
        if m.group(1) not in known and (rel, enclosing_function(src, m.start())[0]) not in WRAPPERS:
            raise SourceError("%s:%d: %s sends commands this script does not read; teach it" % (
                rel, line(m.start()), m.group(1)))
    calls = "|".join(known)
    for m in re.finditer(r"\b(%s)\s*\(" % calls, src):
        fn, body_start = enclosing_function(src, m.start())
        where = "%s:%d" % (rel, line(m.start()))
        # a declaration or a wrapper's own definition is not a call site
        if (rel, fn) in WRAPPERS or src[max(0, m.start() - 16):m.start()].rstrip().endswith("*"):
            continue
        if (rel, fn) in TO_SENTINEL:
            continue
        args = call_args(src, m.end() - 1)
        name = m.group(1)
        if name in FMT_CALLS:
            fmt = literal(args[FMT_CALLS[name]])
            if fmt is None:
                raise SourceError("%s: the format string is not a literal" % where)
            words = fmt.split()
            if words and "%" in words[0]:
                raise SourceError("%s: the command word is built at run time (%s)" % (where, fmt))
            r = rule(words[:1] + [w for w in words[1:2] if "%" not in w], where)
        else:
            am = re.fullmatch(r"(\w+)(?:\s*\+\s*(\d+))?", args[ARGV_CALLS[name]])
            if not am:
                raise SourceError("%s: argv is not `name` or `name + N`" % where)
            body = src[body_start:m.start()]
            off = int(am.group(2) or 0)
            words = [argv_element(body, am.group(1), off, where)]
            if words[0].upper() in CONTAINERS:
                words.append(argv_element(body, am.group(1), off + 1, where))
            r = rule(words, where)
        rules.setdefault(r, []).append(where)
    for m in LUA_CALL.finditer(src):
        words = [w for w in m.groups() if w]
        rules.setdefault(rule(words, rel), []).append("%s:%d (Lua)" % (rel, line(m.start())))


def derive(root=ROOT):
    """{rule: [places]} for every command the C source under root sends."""
    rules = {}
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for fn in sorted(files):
                if fn.endswith(".c"):
                    scan_file(root, os.path.relpath(os.path.join(dirpath, fn), root), rules)
    return rules


def acl_user(path, user="medley"):
    """The rules of `user NAME ...` in an ACL file, as a list of words."""
    with open(path) as f:
        for l in f:
            w = l.split()
            if len(w) > 1 and w[0] == "user" and w[1] == user:
                return w[2:]
    raise SourceError("%s has no `user %s` line" % (path, user))


def check(path, root=ROOT):
    """Problems with path's medley user against the rules derived from the source under root
    ([] when it allows exactly those)."""
    need = set(derive(root))
    words = acl_user(path)
    probs = []
    allowed = {w.lower() for w in words if w.startswith("+")}
    for w in sorted(need - allowed):
        probs.append("medley sends %s but %s does not allow it" % (w[1:], path))
    for w in sorted(allowed - need):
        probs.append("%s allows %s, which medley no longer sends" % (path, w[1:]))
    # Everything else starts from nothing: no categories, other keys or channels, and the
    # resets come before the patterns they would otherwise erase.
    expect_order = ["resetkeys", "resetchannels", "~medley:*", "&medley:*", "-@all"]
    pos = [words.index(w) if w in words else -1 for w in expect_order]
    if -1 in pos or pos != sorted(pos):
        probs.append("%s: the medley user must have, in this order, %s" % (
            path, " ".join(expect_order)))
    extra = [w for w in words if w[0] in "~&%@" and w not in ("~medley:*", "&medley:*")
             or w.startswith("+@") or w in ("allkeys", "allchannels", "allcommands", "nopass")]
    if extra:
        probs.append("%s: the medley user must not have %s" % (path, " ".join(extra)))
    if not any(w.startswith(">") or w.startswith("#") for w in words):
        probs.append("%s: the medley user has no password" % path)
    return probs


def main(argv):
    try:
        if len(argv) == 2 and argv[0] == "--check":
            probs = check(argv[1])
            for p in probs:
                print("redis-acl: " + p, file=sys.stderr)
            if not probs:
                print("redis-acl: %s allows exactly the %d commands medley sends" % (
                    argv[1], len(derive())))
            return 1 if probs else 0
        rules = derive()
        if argv == ["--where"]:
            for r in sorted(rules):
                print("%-16s %s" % (r, ", ".join(sorted(set(rules[r])))))
        elif not argv:
            print("\n".join(sorted(rules)))
        else:
            print(__doc__.split("\n\n")[-1], file=sys.stderr)
            return 2
        return 0
    except SourceError as e:
        print("redis-acl: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

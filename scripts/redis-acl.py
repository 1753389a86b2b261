#!/usr/bin/env python3
"""redis-acl.py — the Redis commands medley sends, read from its C source, the Redis user of
each role that sends them (deploy/redis/users.acl), and the check that every user allows
exactly what its role's code sends.

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

Roles (SENDERS below says which code each role's processes run; POLICY the keys each may
read or write, as Redis 7 `%R~`/`%W~` patterns and selectors; docs/operations.md):
  medley-client     submit, status, results, cancel, batches
  medley-worker     answers; no EVAL (only EVALSHA), no XADD to queues, no DEL of streams
  medley-scheduler  reads heartbeats and backlogs, writes the plan and its lease
  medley-dashboard  reads everything, writes nothing
  medley-operator   the dashboard's actions (cancel, drain, undrain, answering the queued
                    lines of a cancelled batch nobody serves) and no more
  medley-api        the client's rights plus its own keys (medley:api:*, file:*, tenant:*)
  medley-admin      rotation (ACL SETUSER, CONFIG SET of TLS files), scripts, housekeeping
  medley            every role at once (one host, or before moving to the role users)

  scripts/redis-acl.py                 the rules, one a line (+hset, +script|load, ...)
  scripts/redis-acl.py --where         each rule with the places (and roles) that need it
  scripts/redis-acl.py --generate      the ACL file, every user with the password CHANGE-ME
  scripts/redis-acl.py --check FILE    exit 1 unless every user of FILE is the generated one
                                       (passwords aside): a role whose code sends a command
                                       its user lacks, or a user allowing more, fails
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
TO_SENTINEL = {("common/redis_dial.c", "ask"), ("common/redis_dial.c", "open_sentinel"),
               ("common/redis_dial.c", "failing_over"), ("common/redis_watch.c", "sentinel_subscribe")}
ROLES = ("client", "worker", "scheduler", "dashboard", "operator", "api", "admin")
ALL = ROLES
# Which roles' processes send the commands of a call site. The most specific key wins:
# "file:function:+rule", "file:function" (for a Lua script at file level, the name of its
# string or macro), "file", "folder/". A call site none names is an error: new code must say
# whose it is. Shared code (queue/queue.c) names every role that calls it.
SENDERS = {
    "common/redis.c:md_redis_check_prefix": ALL,
    "common/redis.c:md_redis_wait_replicas": ("client",),
    "common/redis.c:md_redis_check_primary": ("worker",),
    "common/redis_dial.c:is_primary": ALL,
    "common/redis_dial.c:md_redis_dial_node:+auth": ALL,
    # SELECT reaches another database's keys, whatever the key patterns say: no role but the
    # admin may; a fleet is a --prefix, not a database (docs/operations.md).
    "common/redis_dial.c:md_redis_dial_node:+select": ("admin",),
    "cli/cmd_client.c": ("client",),
    "cli/cmd_health.c": ("worker",),
    "cli/cmd_run.c": ("client",),
    "queue/client.c": ("client",),
    "queue/submit.c": ("client",),
    "queue/resume.c": ("client",),
    # which answers of P {B}:out to trust: `medley results` and the API's output files
    "queue/trust.c": ("client", "api"),
    "queue/plan.c": ("client", "worker"),
    "queue/queue.c": ("client",),
    # the dashboard's actions, through its operator connection (dashboard/api.c dash_op): the
    # cancel, and answering the queued lines of a batch nobody serves (dashboard/unserved.c)
    "queue/queue.c:q_complete_lua": ("worker", "operator"),
    "queue/queue.c:Q_LUA_FINISH": ("worker", "client", "operator"),
    "queue/queue.c:q_cancel_lua": ("client", "operator"),
    "queue/queue.c:q_stage_del_lua": ("worker",),
    "queue/queue.c:eval_status": ("client", "operator"),
    "queue/queue.c:q_batch_get": ("client", "dashboard"),
    # q_script_load: the client loads medley's scripts at submit; a worker tries too and, when
    # refused (NOPERM), runs them by the SHA1 it computes (worker/worker.c).
    "queue/queue.c:q_script_load": ("client",),
    "scheduler/": ("scheduler",),
    "dashboard/": ("dashboard",),
    "dashboard/api.c:dash_api_drain": ("operator",),
    "dashboard/api.c:drain_lua": ("operator",),
    "dashboard/api.c:dash_api_undrain": ("operator",),
    "dashboard/unserved.c:answer": ("operator",),
    "worker/": ("worker",),
    "api/": ("api",),
}
# Roles that also hold another role's commands.
INHERITS = {"api": ("client",)}
# Rules no call site sends: what a person does by hand as that role.
BY_HAND = {
    "admin": ("+acl|deluser", "+acl|list", "+acl|log", "+acl|save", "+acl|setuser",
              "+client|kill", "+client|list", "+config|get", "+config|set", "+del",
              "+hgetall", "+info", "+ping", "+scan", "+script|load", "+subscribe",
              "+xinfo|consumers", "+xinfo|groups", "+xlen", "+xpending", "+xrange", "+zrem"),
}
# What each role may touch. `root` are the user's own key/channel patterns (for every command
# of the role not in a selector); each selector `(patterns rules)` is the only place where its
# rules run, so e.g. a worker's XADD reaches answers and dead letters but never a queue.
# Patterns are glob: `medley:{*}:out` is every batch's output stream.
POLICY = {
    "client": {
        "root": ["~medley:q:*", "~medley:{*}:meta", "~medley:{*}:ids", "~medley:{*}:sent",
                 "~medley:batches",
                 "%R~medley:{*}:out", "%R~medley:plan", "&medley:events"],
        "selectors": [],
    },
    "worker": {
        # medley:online:* the online lanes (read like the queues), medley:cancel:* their
        # requests' cancel keys (docs/protocol.md §9)
        "root": ["~medley:q:*", "~medley:online:*", "~medley:{*}:meta", "~medley:worker:*",
                 "~medley:replica:*", "%R~medley:plan", "%R~medley:plan:version",
                 "%R~medley:dlq:*", "%R~medley:batches", "%R~medley:drain:*",
                 "%R~medley:cancel:*", "&medley:events"],
        # EVALSHA checks the keys a script is given: its own selector, so the root's commands
        # (XDEL, XRANGE, ...) never reach answers
        "selectors": [(["~medley:{*}:meta", "~medley:{*}:done", "~medley:{*}:out",
                        "~medley:replica:*"], ["+evalsha"]),
                      (["%W~medley:{*}:out", "~medley:dlq:*", "%W~medley:reply:*"],
                       ["+xadd"]),
                      (["~medley:{*}:done"], ["+sadd"]),
                      (["~medley:worker:*", "~medley:replica:*"], ["+del"]),
                      (["~medley:replica:*"], ["+set"]),
                      (["~medley:worker:*", "~medley:reply:*"], ["+pexpire"])],
    },
    "scheduler": {
        "root": ["%R~medley:worker:*", "%R~medley:q:*", "%R~medley:{*}:meta", "~medley:plan",
                 "~medley:plan:version", "~medley:scheduler:*", "&medley:events"],
        "selectors": [(["~medley:scheduler:*"], ["+del", "+pexpire"])],
    },
    "dashboard": {"root": ["%R~medley:*", "&medley:events"], "selectors": []},
    "operator": {
        # reads only what the scripts read (EXISTS, HMGET) and the prefix check (P plan)
        "root": ["%R~medley:plan", "%R~medley:{*}:meta", "%R~medley:worker:*", "&medley:events"],
        # the writes: cancel and drain (meta, heartbeats, the drain key), and answering the
        # queued lines of a batch nobody serves (the completion script, then XACK + XDEL)
        # (answers write-only: it may add an answer line, never read or delete one)
        "selectors": [(["~medley:{*}:meta", "~medley:worker:*", "~medley:{*}:out",
                        "~medley:{*}:done", "~medley:drain:*"], ["+eval"]),
                      (["~medley:{*}:meta", "~medley:worker:*"], ["+hset"]),
                      (["~medley:{*}:meta"], ["+hincrby"]),
                      (["~medley:{*}:done"], ["+sadd"]),
                      (["%W~medley:{*}:out"], ["+xadd"]),
                      (["~medley:drain:*"], ["+set", "+del"]),
                      (["~medley:q:*"], ["+xack", "+xdel"])],
    },
    "api": {
        "root": ["~medley:q:*", "~medley:{*}:meta", "~medley:{*}:ids", "~medley:{*}:sent",
                 "~medley:batches",
                 "%R~medley:{*}:out", "%R~medley:plan", "~medley:api:*", "~medley:file:*",
                 "~medley:tenant:*", "%R~medley:worker:*", "~medley:online:*",
                 "~medley:reply:*", "&medley:events"],
        # deleting an output or error file deletes its lines from the batch's answers
        # (api/outputs.c); nothing else of the API writes there. Online requests: a client
        # gone away is told to the workers by its cancel key
        "selectors": [(["~medley:{*}:out"], ["+xdel"]), (["~medley:cancel:*"], ["+set"])],
    },
    "admin": {"root": ["~medley:*", "&medley:*"], "selectors": []},
}
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


def enclosing_name(src, pos):
    """The name a position belongs to: the function around it, or the string constant or macro
    defined at file level nearest before it (a Lua script)."""
    fn, body = enclosing_function(src, pos)
    best = (body, fn)
    for m in re.finditer(r"^(?:#define\s+(\w+)|[\w ]*?\bchar\s*\*?\s*(\w+)\s*(?:\[\s*\])?\s*=)",
                         src[:pos], re.M):
        if m.start() >= best[0]:
            best = (m.start(), m.group(1) or m.group(2))
    return best[1]


def senders(rel, name, r):
    """The roles of SENDERS for a rule sent from function (or constant) name of file rel."""
    for key in ("%s:%s:%s" % (rel, name, r), "%s:%s" % (rel, name), rel,
                rel.split("/")[0] + "/"):
        if key in SENDERS:
            return SENDERS[key]
    raise SourceError("%s (%s) sends %s but SENDERS in scripts/redis-acl.py names no role "
                      "for it" % (rel, name, r[1:]))


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


def scan_file(root, rel, rules, roles=None):
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
        if roles is not None:
            for role in senders(rel, fn, r):
                roles.setdefault(role, set()).add(r)
    for m in LUA_CALL.finditer(src):
        words = [w for w in m.groups() if w]
        r = rule(words, rel)
        rules.setdefault(r, []).append("%s:%d (Lua)" % (rel, line(m.start())))
        if roles is not None:
            for role in senders(rel, enclosing_name(src, m.start()), r):
                roles.setdefault(role, set()).add(r)


_DERIVED = {}


def derive(root=ROOT, roles=None):
    """{rule: [places]} for every command the C source under root sends; with a dict roles,
    also fills {role: {rules its processes send}}. Read once per root and process."""
    if root in _DERIVED:
        rules, got = _DERIVED[root]
        if roles is not None:
            roles.update({k: set(v) for k, v in got.items()})
        return {k: list(v) for k, v in rules.items()}
    rules, got = {}, {}
    _scan(root, rules, got)
    _DERIVED[root] = (rules, got)
    return derive(root, roles)


def _scan(root, rules, roles):
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for fn in sorted(files):
                if fn.endswith(".c"):
                    scan_file(root, os.path.relpath(os.path.join(dirpath, fn), root), rules,
                              roles)


def role_rules(root=ROOT):
    """{role: sorted rules}: what each role's code sends, inherited roles and BY_HAND added."""
    roles = {}
    derive(root, roles)
    out = {}
    for role in ROLES:
        got = set(roles.get(role, ()))
        for parent in INHERITS.get(role, ()):
            got |= roles.get(parent, set())
        got |= set(BY_HAND.get(role, ()))
        out[role] = sorted(got)
    return out


def role_line(role, rules, password="CHANGE-ME"):
    """The ACL file line of medley-<role>: patterns, then the root's rules, then selectors."""
    pol = POLICY[role]
    in_sel = {r for _, rs in pol["selectors"] for r in rs}
    missing = in_sel - set(rules)
    if missing:
        raise SourceError("POLICY gives medley-%s a selector for %s, which its code no longer "
                          "sends" % (role, " ".join(sorted(missing))))
    words = ["user", "medley-" + role, "on", ">" + password, "resetkeys", "resetchannels"]
    words += pol["root"] + ["-@all"] + [r for r in rules if r not in in_sel]
    for pats, rs in pol["selectors"]:
        words.append("(" + " ".join(pats + ["resetchannels", "-@all"] + sorted(rs)) + ")")
    return " ".join(words)


def generate(root=ROOT):
    """The whole ACL file text, passwords CHANGE-ME."""
    rr = role_rules(root)
    union = sorted(set(derive(root)))
    lines = ["user default off"]
    lines.append("user medley on >CHANGE-ME resetkeys resetchannels ~medley:* &medley:* -@all "
                 + " ".join(union))
    lines += [role_line(role, rr[role]) for role in ROLES]
    return "\n".join(lines) + "\n"


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
    return probs + check_roles(path, root)


def check_roles(path, root=ROOT):
    """Problems with path's role users against the lines generate() makes from the source
    under root: each must hold exactly those words, its own password(s) aside."""
    probs = []
    want = {l.split()[1]: l.split()[2:] for l in generate(root).splitlines()[2:]}
    for user, expect in want.items():
        try:
            words = acl_user(path, user)
        except SourceError as e:
            probs.append(str(e))
            continue
        if not any(w.startswith(">") or w.startswith("#") for w in words):
            probs.append("%s: %s has no password" % (path, user))
        got = [w for w in words if not w.startswith(">") and not w.startswith("#")]
        expect = [w for w in expect if not w.startswith(">")]
        for w in expect:
            if w not in got:
                probs.append("%s's code needs %s but %s's %s lacks it (run scripts/redis-acl.py "
                             "--generate)" % (user, w.strip("()"), path, user))
        for w in got:
            if w not in expect:
                probs.append("%s's %s has %s, which its code does not need" % (
                    path, user, w.strip("()")))
        if not probs and got != expect:
            probs.append("%s: %s's words are out of order (run scripts/redis-acl.py "
                         "--generate)" % (path, user))
    return probs


def main(argv):
    try:
        if len(argv) == 2 and argv[0] == "--check":
            probs = check(argv[1])
            for p in probs:
                print("redis-acl: " + p, file=sys.stderr)
            if not probs:
                print("redis-acl: %s: every user allows exactly the commands its role sends "
                      "(%d in all)" % (argv[1], len(derive())))
            return 1 if probs else 0
        if argv == ["--generate"]:
            sys.stdout.write(generate())
            return 0
        roles = {}
        rules = derive(roles=roles)
        if argv == ["--where"]:
            for r in sorted(rules):
                who = ",".join(role for role in ROLES if r in roles.get(role, ()))
                print("%-16s [%s] %s" % (r, who, ", ".join(sorted(set(rules[r])))))
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

#!/usr/bin/env python3
"""queue_acl_source.py — deploy/redis/users.acl allows exactly the Redis commands medley's C
source sends (scripts/redis-acl.py), and the reader of the source finds commands in every
form the code writes them and refuses those it cannot name. No Redis needed (label unit);
queue_tls_acl.py runs the same file against a real server."""
import importlib.util
import os
import shutil
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("redis_acl",
                                              os.path.join(SOURCE_DIR, "scripts", "redis-acl.py"))
acl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(acl)
ACL_FILE = os.path.join(SOURCE_DIR, "deploy", "redis", "users.acl")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def tree(files):
    """A temp source tree: {relative path: text}."""
    root = tempfile.mkdtemp(prefix="medley-acl-")
    for rel, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    return root


def derive_text(text):
    root = tree({"worker/x.c": text})
    try:
        return sorted(acl.derive(root))
    finally:
        shutil.rmtree(root)


def refuses(text, words):
    try:
        got = derive_text(text)
    except acl.SourceError as e:
        for w in words:
            if w not in str(e):
                fail("the error for a dynamic command should say %r: %s" % (w, e))
        return
    fail("a command the reader cannot name was accepted: %s" % got)


def the_checked_in_acl_is_exact():
    probs = acl.check(ACL_FILE)
    if probs:
        fail("deploy/redis/users.acl against the source:\n  " + "\n  ".join(probs))


def every_form_the_code_uses_is_read():
    got = derive_text(r'''
static int f(md_redis *r, md_err *e, const char *key) {
    redisReply *rep = md_redis_cmd(r, e, "HSET %s a %s "
                                         "b %d", key, "x", 1);
    rep = md_redis_cmd(r, e, "XGROUP CREATE %s g 0 MKSTREAM", key);
    redisAppendCommand(c, "XINFO GROUPS %s", key);
    rep = redisCommand(c, "EVAL %s 1 %s", "return redis.call('pexpire', KEYS[1], 5)", key);
    const char *argv[] = {"XADD", key, "*"};
    md_redis_cmd_argv(r, 3, argv, lens, e);
    return 0;
}
static void g(md_redis *r) {
    const char **argv = malloc(8 * sizeof *argv);
    int k = 3;
    argv[0] = "XACK";
    argv[k++] = id;
    redisAppendCommandArgv(c, k, argv, lens);
    argv[1] = "XDEL"; /* reuses the id list */
    redisAppendCommandArgv(c, k - 1, argv + 1, lens + 1);
    for (int i = 0; i < 3; i++)
        lens[i] = 1;
    k = 0;
    argv[k++] = "XCLAIM";
    argv[k++] = key;
    md_redis_cmd_argv(r, k, argv, lens, &e);
}
/* md_redis_cmd(r, e, "FLUSHALL") in a comment is not a call */
const char lua[] = "redis.call('SADD', KEYS[1], 'x') redis.pcall('SCRIPT', 'LOAD', 'y')";
''')
    want = ["+eval", "+hset", "+pexpire", "+sadd", "+script|load", "+xack", "+xadd", "+xclaim",
            "+xdel", "+xgroup|create", "+xinfo|groups"]
    if got != want:
        fail("derived %s, expected %s" % (got, want))


def commands_built_at_run_time_are_refused():
    refuses('void f(void) { md_redis_cmd(r, e, "%s %s", verb, key); }',
            ["worker/x.c:1", "built at run time"])
    refuses('void f(const char *fmt) { redisCommand(c, fmt, key); }',
            ["worker/x.c:1", "not a literal"])
    refuses('void f(void) { const char *argv[2]; argv[0] = verb; '
            'md_redis_cmd_argv(r, 2, argv, lens, e); }', ["argv[0] is not a literal"])
    refuses('void f(void) { md_redis_cmd(r, e, "XGROUP %s %s", sub, key); }',
            ["XGROUP needs a literal subcommand"])
    refuses('void f(void) { redisvAppendCommand(c, "GET %s", ap); }',
            ["redisvAppendCommand", "teach it"])


def acl_drift_is_caught():
    with open(ACL_FILE) as f:
        text = f.read()
    cases = [
        (text.replace(" +xdel", ""), "medley sends xdel but"),
        (text.replace(" +zadd", " +zadd +flushall"), "allows flushall, which medley no longer"),
        (text.replace(" +zadd", " +zadd +@read"), "must not have +@read"),
        (text.replace("resetchannels ~medley:* &medley:*", "~medley:* &medley:* resetchannels"),
         "in this order"),
        (text.replace(" ~medley:*", " ~medley:* ~*"), "must not have ~*"),
    ]
    d = tempfile.mkdtemp(prefix="medley-acl-")
    try:
        for i, (bad, want) in enumerate(cases):
            if bad == text:
                fail("case %d did not change the ACL file" % i)
            path = os.path.join(d, "users.acl")
            with open(path, "w") as f:
                f.write(bad)
            probs = " | ".join(acl.check(path))
            if want not in probs:
                fail("case %d: expected a problem saying %r, got %r" % (i, want, probs))
    finally:
        shutil.rmtree(d)


def role_drift_is_caught():
    """A role user lacking a command its code sends, or holding one it does not, fails; so
    does a call site no role owns."""
    with open(ACL_FILE) as f:
        text = f.read()

    def edit(user, old, new):
        out = []
        for l in text.splitlines():
            if l.startswith("user %s " % user):
                if old not in l:
                    fail("%r is not in %s's line" % (old, user))
                l = l.replace(old, new, 1)
            out.append(l)
        return "\n".join(out) + "\n"

    cases = [
        (edit("medley-worker", " +xack", ""), "medley-worker's code needs +xack"),
        (edit("medley-client", " +zadd", ""), "medley-client's code needs +zadd"),
        (edit("medley-worker", " +xack", " +xack +eval"), "has +eval, which its code does not"),
        (edit("medley-worker", " +xack", " +xack +select"), "has +select"),
        (edit("medley-worker", " (~medley:{*}:done", " (~medley:q:*"), "needs ~medley:{*}:done"),
        (edit("medley-dashboard", "%R~medley:*", "~medley:*"), "has ~medley:*"),
        (text.replace("user medley-scheduler", "user medley-schedulr"),
         "no `user medley-scheduler` line"),
    ]
    d = tempfile.mkdtemp(prefix="medley-acl-")
    try:
        for i, (bad, want) in enumerate(cases):
            path = os.path.join(d, "users.acl")
            with open(path, "w") as f:
                f.write(bad)
            probs = " | ".join(acl.check(path))
            if want not in probs:
                fail("role case %d: expected a problem saying %r, got %r" % (i, want, probs))
    finally:
        shutil.rmtree(d)
    root = tree({"common/fresh.c": 'void f(void) { md_redis_cmd(r, e, "XTRIM %s", k); }'})
    try:
        acl.derive(root, roles={})
        fail("a call site no role owns was accepted")
    except acl.SourceError as e:
        if "names no role" not in str(e):
            fail("a call site no role owns: %s" % e)
    finally:
        shutil.rmtree(root)


for t in (the_checked_in_acl_is_exact, every_form_the_code_uses_is_read,
          commands_built_at_run_time_are_refused, acl_drift_is_caught, role_drift_is_caught):
    t()
    print("ok", t.__name__)

"""A warm slot's program, already inside its sandbox: bwrap started it (as root, in the
sandbox's namespaces, mounts and cgroups) and it waits for one start message, then drops to the
app's uid and becomes the app.

Stdlib only, compatible with any Python 3 a machine has in its visible system directories (it
runs inside the sandbox, where the control plane's own Python may not be): bwrap puts a
read-only copy of this file in the sandbox (`bwrap.SLOT_PROGRAM`) and the agent runs it by path,
as `python3 -I -S /.wakeful/slot_main.py SLOT_MARK READY_FD` (never its source as `-c`: bwrap
keeps its argv for the sandbox's life). It writes one byte to READY_FD once it waits, then
reads the message from stdin, JSON: `argv` (the app's command, found through the `PATH` of
`env`), `env` (the app's whole environment), `rlimits` ([name, value] pairs, soft = hard) and
`uid` (the app's uid and gid). It sets the rlimits; drops every capability from the bounding,
ambient and inheritable sets, the groups, then gid and uid (which empties the permitted and
effective sets), and sets no_new_privs; reads /proc/self/status back and refuses to go on (exit
126) unless all of that holds; resets SIGPIPE and SIGXFSZ (Python ignores them, and an ignored
signal stays ignored across exec); and execs the command. EOF without a message (the agent
discards the slot) is a quiet exit. With `scope` true in the message it first puts itself in
a Landlock domain of its own that scopes abstract UNIX sockets and signals (`scope`).

The cold chain (no warm slot) runs the same file as `python3 -I -S /.wakeful/slot_main.py
SCOPE_MARK COMMAND...` after its uid drop: it only sets no_new_privs, scopes itself and execs
COMMAND.

An image app's chain runs it as root, in place of the uid drop, as `python3 -I -S
/.wakeful/slot_main.py IMAGE_MARK ROOT WORKDIR UID ENV_FD SCOPE COMMAND...`: the app's root
filesystem is mounted at ROOT (where neither this Python nor setpriv exist), so this step
chroots into it (and to its /), drops every privilege as a warm slot does and checks it, only
then changes to WORKDIR (as the app, which may go nowhere it could not go itself), scopes
itself when SCOPE is 1, and execs COMMAND with the environment read from ENV_FD
(NUL-separated `NAME=value` entries: never a command line), found through that environment's
PATH, as docker does. chroot is no boundary for root; the process is never root after it.
"""

import ctypes
import os
import signal
import sys
from typing import Any, NoReturn

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_VERSION_3 = 0x20080522
SCOPE_MARK = "wakeful-scope"
IMAGE_MARK = "wakeful-image"
LANDLOCK_CREATE_RULESET, LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every architecture
LANDLOCK_SCOPES = 0x1 | 0x2  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL


def fail(message: str, code: int = 126) -> NoReturn:
    sys.stderr.write("wakeful slot: " + message + "\n")
    sys.stderr.flush()
    os._exit(code)


def drop_privileges(libc: Any, uid: int) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as file:
        last = int(file.read())
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            fail(f"cannot drop capability {cap}: errno {ctypes.get_errno()}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to a uid: permitted and effective sets emptied
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): all empty
    if libc.capset(header, data) != 0:
        fail(f"cannot clear capabilities: errno {ctypes.get_errno()}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail(f"cannot set no_new_privs: errno {ctypes.get_errno()}")


def scope(libc: Any) -> None:
    """Enter a Landlock domain of this sandbox's own (no_new_privs must be set) that handles
    no file or port access, only scopes: no connecting to an abstract UNIX socket made outside
    it (the host's, another sandbox's), no signal to a process outside it. Landlock ABI 6
    (Linux 6.12); the agent asks for it only where the kernel has it."""
    attr = (ctypes.c_uint64 * 3)(0, 0, LANDLOCK_SCOPES)  # fs, net, scoped: 24 bytes
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, attr, ctypes.sizeof(attr), 0)
    if ruleset < 0:
        fail(f"cannot make a Landlock ruleset: errno {ctypes.get_errno()}")
    if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        fail(f"cannot enter a Landlock domain: errno {ctypes.get_errno()}")
    os.close(ruleset)


def scope_and_exec(argv: list[str]) -> NoReturn:
    """The cold chain's last step, as the app's uid with its environment: scope, then exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail(f"cannot set no_new_privs: errno {ctypes.get_errno()}")
    scope(libc)
    default_signals()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc.strerror}", 127)


def default_signals() -> None:
    """Every signal at its default: an ignored signal stays ignored across exec, and Python
    ignores SIGPIPE and SIGXFSZ, and inherits whatever the agent was started with ignored
    (`nohup` ignores SIGHUP; a shell's background job, SIGINT and SIGQUIT)."""
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):  # one the C library keeps for itself (32, 33)
                continue


def check_dropped(uid: int) -> None:
    """What /proc says, not what the calls returned: the app starts only without privileges."""
    status: dict[str, list[str]] = {}
    with open("/proc/self/status") as file:
        for line in file:
            name, _, value = line.partition(":")
            status[name] = value.split()
    wanted = {
        "Uid": [str(uid)] * 4,
        "Gid": [str(uid)] * 4,
        "Groups": [],
        "CapInh": ["0000000000000000"],
        "CapPrm": ["0000000000000000"],
        "CapEff": ["0000000000000000"],
        "CapBnd": ["0000000000000000"],
        "CapAmb": ["0000000000000000"],
        "NoNewPrivs": ["1"],
    }
    for field, expected in wanted.items():
        if status.get(field) != expected:
            fail(f"privileges not dropped: {field} is {status.get(field)}")


def image_exec(args: list[str]) -> NoReturn:
    """An image app's last step (`IMAGE_MARK`), as root: into its root, then the app."""
    root, workdir, uid_text, env_fd, scoped, *argv = args
    uid = int(uid_text)
    if uid <= 0:
        fail(f"refusing uid {uid}")
    with os.fdopen(int(env_fd), "rb") as file:
        raw = file.read()
    env = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[os.fsdecode(name)] = os.fsdecode(value)
    os.chroot(root)
    os.chdir("/")  # the old working directory is outside the new root
    libc = ctypes.CDLL(None, use_errno=True)
    drop_privileges(libc, uid)
    check_dropped(uid)
    try:  # as the app: a path such as /proc/1/root leads nowhere it could not go itself
        os.chdir(workdir)
    except OSError as exc:
        fail(f"cannot enter its working directory {workdir}: {exc.strerror}")
    if scoped == "1":
        scope(libc)
    default_signals()
    if not argv:
        fail("the image names no command (no Entrypoint or Cmd) and wakeful.toml none", 127)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc.strerror}", 127)


def main() -> None:
    if sys.argv[1] == SCOPE_MARK:
        scope_and_exec(sys.argv[2:])
    if sys.argv[1] == IMAGE_MARK:
        image_exec(sys.argv[2:])
    # Imported here, not at the top: json alone costs the cold chain's scope step ~4 ms.
    import json
    import resource

    ready = int(sys.argv[2])  # after the mark that tells an idle slot in `ps`
    os.write(ready, b"r")
    os.close(ready)
    raw = sys.stdin.buffer.read()
    if not raw:
        return
    message = json.loads(raw)
    uid = int(message["uid"])
    if uid <= 0:
        fail(f"refusing uid {uid}")
    for name, value in message["rlimits"]:
        limit = getattr(resource, f"RLIMIT_{name}")
        resource.setrlimit(limit, (int(value), int(value)))
    libc = ctypes.CDLL(None, use_errno=True)
    drop_privileges(libc, uid)
    check_dropped(uid)
    if message.get("scope"):
        scope(libc)
    default_signals()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    argv = [str(arg) for arg in message["argv"]]
    env = {str(k): str(v) for k, v in message["env"].items()}
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc.strerror}", 127)


if __name__ == "__main__":
    main()

"""Running Slurm's own commands: argument lists (never a shell), a timeout, one error type.

Everything topowatch asks slurmctld goes through `SlurmCli`, so the rules that keep a head node
safe live in one place: an argv list (a node name with shell metacharacters is one argument, never
a command), a timeout (a hung slurmctld costs one timeout, not a thread; the command's whole
process group is killed with it, see `run_in_group`), and a node name check before any write
(`scontrol update` takes `key=value` words: a name holding `=`, a space or a comma would change
what is updated, so it is refused, not quoted). The one shell is `run_in_group`'s keeper, a fixed
script that never sees an argument.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

# What a Slurm NodeName may hold that cannot change the meaning of an scontrol word: letters,
# digits and `-_.`. slurm.conf allows more (it is a hostname), but nothing else is needed for
# HyperPod's names (ip-10-1-2-3, gpu-st-p5-1) and anything else is refused before a write.
_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNKNOWN_OPTION = ("unrecognized option", "invalid option")
MAX_REASON_CHARS = 200  # a node Reason is shown in sinfo -R; keep it one readable line


# The process group's keeper (`run_in_group`): blocks on its stdin, a pipe whose only writer is
# this process, and kills its whole group at end of file. A fixed script: no argument of ours
# is ever part of it.
_KEEPER = "read _; kill -s KILL 0"
_KEEPER_SHELL = "/bin/sh"


class SlurmCommandError(RuntimeError):
    """A Slurm command that could not run, timed out, or exited non-zero; the message says which."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # missing | timeout | failed | refused: a metric label


def safe_node_name(name: str) -> bool:
    return bool(_SAFE_NODE.match(name))


def safe_reason(text: str) -> str:
    """A Reason as one line of printable text (scontrol takes it as one argv word)."""
    flat = " ".join(text.split())
    return "".join(c for c in flat if c.isprintable())[:MAX_REASON_CHARS]


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`'s `Key = Value` lines (the first of a key wins; headings, blank
    lines and the trailing `Slurmctld(primary) at ... is UP` have no `=` and are skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and " " not in key:
            out.setdefault(key, value.strip())
    return out


def unset(value: str | None) -> bool:
    """A `scontrol show config` value that means "not configured"."""
    return value is None or value.strip() in ("", "(null)", "None")


class SlurmCli:
    """scontrol, sinfo and squeue with a timeout each; `bin_dir` picks a Slurm other than PATH's."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 15.0,
        bin_dir: str | None = None,
        binaries: Mapping[str, str] | None = None,
    ) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        self.binaries = dict(binaries or {})  # a path per command name, over bin_dir and PATH
        self._scontrol_lacks_json = False

    def binary(self, name: str) -> str:
        if name in self.binaries:
            return self.binaries[name]
        if self.bin_dir is not None:
            return os.path.join(self.bin_dir, name)
        search = (self.env or os.environ).get("PATH")
        found = shutil.which(name, path=search) or shutil.which(name, path="/usr/sbin:/usr/bin")
        return found or name

    def run(self, argv: Sequence[str]) -> str:
        """stdout of `argv` (argv[0] a Slurm command name); SlurmCommandError otherwise."""
        command = [self.binary(argv[0]), *argv[1:]]
        try:
            code, stdout, stderr = run_in_group(command, self.env, self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(
                f"{argv[0]} timed out after {self.timeout_s:g} s", "timeout"
            ) from exc
        except OSError as exc:
            raise SlurmCommandError(f"cannot run {command[0]}: {exc.strerror}", "missing") from exc
        if code != 0:
            said = " ".join((stderr or stdout).split())[:300]
            raise SlurmCommandError(f"{' '.join(argv[:3])} exited {code}: {said}", "failed")
        return stdout

    # -- reads --

    def nodes_json(self) -> str:
        """`scontrol show nodes --json` (Slurm 23.02+), else `sinfo --json` (21.08 to 22.05,
        where scontrol has no --json; both print the same `nodes` list)."""
        if not self._scontrol_lacks_json:
            try:
                return self.run(["scontrol", "show", "nodes", "--json"])
            except SlurmCommandError as exc:
                if exc.kind != "failed" or not any(w in str(exc) for w in _UNKNOWN_OPTION):
                    raise
                self._scontrol_lacks_json = True  # this Slurm will not learn it while we run
        return self.run(["sinfo", "--json"])

    def squeue_json(self) -> str:
        return self.run(["squeue", "--json"])

    def show_config(self) -> dict[str, str]:
        """`scontrol show config` as {key: value}, values as printed (`(null)` when unset)."""
        return parse_config(self.run(["scontrol", "show", "config"]))

    # -- writes (names checked first) --

    def update_nodes(self, nodes: Sequence[str], state: str, reason: str) -> None:
        """`scontrol update nodename=N1,N2 state=S reason=R`: the only way HyperPod is asked to
        reboot or replace a Slurm node (state=fail reason=Action:Reboot|Action:Replace). One
        call for many nodes: each call costs slurmctld a round trip and a node-table lock."""
        names = self._check(nodes)
        self.run(
            [
                "scontrol",
                "update",
                f"nodename={names}",
                f"state={state}",
                f"reason={safe_reason(reason)}",
            ]
        )

    def reboot_asap(self, nodes: Sequence[str], reason: str) -> None:
        """`scontrol reboot ASAP nextstate=resume reason=R N1,N2`: drain, reboot when the node's
        jobs end (RebootProgram in slurm.conf), back into service when slurmd registers again."""
        names = self._check(nodes)
        self.run(
            [
                "scontrol",
                "reboot",
                "ASAP",
                "nextstate=resume",
                f"reason={safe_reason(reason)}",
                names,
            ]
        )

    @staticmethod
    def _check(nodes: Sequence[str]) -> str:
        """The names as one comma-separated scontrol word, every one checked first."""
        unsafe = [n for n in nodes if not safe_node_name(n)] or ([] if nodes else [""])
        if unsafe:
            raise SlurmCommandError(f"refused: unsafe Slurm node name {unsafe[0]!r}", "refused")
        return ",".join(nodes)


def run_in_group(
    command: Sequence[str], env: Mapping[str, str] | None, timeout_s: float
) -> tuple[int, str, str]:
    """Run `command` in a process group of its own: (exit code, stdout, stderr), or
    `subprocess.TimeoutExpired` after `timeout_s`, when the whole group has been killed.

    Why a group: a hung `scontrol` may be a wrapper script (a site's, or a test's) whose child
    holds the call, or a command that forked; killing only the process started leaves its
    children running, and one could carry out a late `scontrol update` after the decision was
    written off as timed out. `os.killpg` on the command's own group (setpgid(2)) kills them all.

    A group of its own must not outlive this process either: before it, the command sat in the
    caller's group, and whatever killed the controller's group (a test, an init system sending
    the group a signal) took it along. So the group's first member is a keeper, `sh -c "read _;
    kill -s KILL 0"`, whose stdin is a pipe only this process writes to (os.pipe is
    non-inheritable, PEP 446, and subprocess closes other descriptors in every other child). When
    this process ends, however it ends (SIGKILL included), the kernel closes the pipe, `read`
    returns at end of file, and `kill 0` signals the whole group (POSIX kill(2): pid 0 is "all
    processes whose process group ID is equal to the process group ID of the sender"). After a
    normal exit the pipe is closed too: anything the command left running in its group dies
    with the keeper. Under systemd the unit's cgroup is killed anyway (KillMode=control-group);
    the keeper covers a controller run by hand, in a container without an init, or in a test.
    Without /bin/sh the command still gets its own group and the timeout still kills it.
    """
    read_end, write_end = os.pipe()
    keeper: subprocess.Popen[bytes] | None = None
    try:
        keeper = subprocess.Popen(
            [_KEEPER_SHELL, "-c", _KEEPER],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
            env={},
        )
    except OSError:
        keeper = None
    finally:
        os.close(read_end)
    try:
        proc = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            process_group=keeper.pid if keeper is not None else 0,
        )
    except BaseException:
        _release(write_end, keeper)
        raise
    group = keeper.pid if keeper is not None else proc.pid
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:  # the timeout, or an interrupt: the group goes, then the pipes drain
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        proc.communicate()
        _release(write_end, keeper)
        raise
    _release(write_end, keeper)
    return proc.returncode, stdout, stderr


def _release(write_end: int, keeper: subprocess.Popen[bytes] | None) -> None:
    """Close the keeper's pipe (it kills what is left of the group, itself last) and reap it."""
    os.close(write_end)
    if keeper is not None:
        keeper.wait()

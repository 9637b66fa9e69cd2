"""Running Slurm's own commands: argument lists (never a shell), a timeout, one error type.

Everything topowatch asks slurmctld goes through `SlurmCli`, so the rules that keep a head node
safe live in one place: an argv list (a node name with shell metacharacters is one argument, never
a command), a timeout (a hung slurmctld costs one timeout, not a thread), and a node name check
before any write (`scontrol update` takes `key=value` words: a name holding `=`, a space or a comma
would change what is updated, so it is refused, not quoted).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

# What a Slurm NodeName may hold that cannot change the meaning of an scontrol word: letters,
# digits and `-_.`. slurm.conf allows more (it is a hostname), but nothing else is needed for
# HyperPod's names (ip-10-1-2-3, gpu-st-p5-1) and anything else is refused before a write.
_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNKNOWN_OPTION = ("unrecognized option", "invalid option")
MAX_REASON_CHARS = 200  # a node Reason is shown in sinfo -R; keep it one readable line


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
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self.env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(
                f"{argv[0]} timed out after {self.timeout_s:g} s", "timeout"
            ) from exc
        except OSError as exc:
            raise SlurmCommandError(f"cannot run {command[0]}: {exc.strerror}", "missing") from exc
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[:300]
            raise SlurmCommandError(
                f"{' '.join(argv[:3])} exited {done.returncode}: {said}", "failed"
            )
        return done.stdout

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

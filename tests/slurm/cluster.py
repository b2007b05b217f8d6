"""A throw-away single-node SLURM cluster on this machine, for the SLURM tests (``make slurm-test``).

Munge with a key of its own, ``slurmctld`` and ``slurmd`` run in the foreground as child processes with
their configuration, state, spool and logs in one temporary folder, on ports of their own: nothing of the
machine's (``/etc/slurm``, systemd units, a running munge) is read or touched. Commands (``sbatch``,
``squeue``, ``scontrol``) reach it through ``SLURM_CONF``, which :meth:`LocalSlurm.env` gives. The daemons
are stopped, by the ids this object started, when the ``with`` block ends, whatever happened inside.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
PACKAGES = "slurmctld slurmd slurm-client munge"


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """\
ClusterName=specbench-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser={user}
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class LocalSlurm:
    """``with LocalSlurm(folder) as cluster:`` a one-node cluster (partition ``debug``) until the block ends."""

    def __init__(self, root: Path, *, cpus: int | None = None, mem_mb: int = 8000) -> None:
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.mem_mb = mem_mb
        self.procs: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, base: dict | None = None) -> dict[str, str]:
        """An environment whose SLURM commands talk to this cluster."""
        return {**(base if base is not None else os.environ), "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=60)
        if check and out.returncode:
            raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def __enter__(self) -> LocalSlurm:
        missing = missing_tools()
        if missing:
            raise RuntimeError(f"SLURM is not installed ({', '.join(missing)} missing): "
                               f"apt-get install {PACKAGES}")
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, *args: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{Path(args[0]).name}.out", "w")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def _start(self) -> None:
        key = self.root / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._spawn("munged", "--foreground", "--force", f"--socket={self.root}/munge.sock", f"--key-file={key}",
                    f"--log-file={self.root}/log/munged.log", f"--pid-file={self.root}/munged.pid",
                    f"--seed-file={self.root}/munged.seed")
        self._wait(lambda: (self.root / "munge.sock").exists(), "munged did not create its socket")
        self.conf.write_text(CONF.format(root=self.root, node=self.node, cpus=self.cpus, mem_mb=self.mem_mb,
                                         ctld_port=_free_port(), d_port=_free_port(), user=getpass.getuser()))
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%t", check=False).strip() == "idle",
                   "the node did not come up idle")

    def _wait(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].args[0]} exited ({dead[0].returncode}); logs in {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {timeout:.0f} s; logs in {self.root / 'log'}")

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons this object started (their process groups)."""
        if self.procs and self.conf.exists():
            self.run("scancel", "-u", getpass.getuser(), check=False)
            deadline = time.monotonic() + 20
            while self.run("squeue", "-h", check=False).strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (empty when SLURM no longer knows the job)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

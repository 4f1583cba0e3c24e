"""Slurm's word on a job's nodes before a restart: which of them the next job step must not use.

A node is unusable when ``scontrol show node`` gives it a state that takes it out of service
(:data:`UNUSABLE`: DOWN, DRAIN, FAIL, NOT_RESPONDING, ...; ``sinfo`` marks the last with ``*``), when
Slurm does not know it, or when the job no longer holds it: a job allocated with ``--no-kill``
keeps running when a node fails, and Slurm takes the failed node out of the job
(``squeue -j JOB -o %N``). :func:`judge_nodes` is the pure rule; :func:`unusable_nodes` asks Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from .commands import SlurmError, expand_hostlist, slurm_run

# Node state words (base state or flag, as scontrol joins them: "MIXED+NOT_RESPONDING",
# "IDLE+DRAIN") that keep a node from running a job step's tasks.
UNUSABLE = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
            "POWER_DOWN", "POWERING_DOWN", "REBOOT_ISSUED", "REBOOT_REQUESTED", "FUTURE", "UNKNOWN")
QUERY_TIMEOUT = 10.0  # seconds each Slurm query may take before a restart; without an answer, the agents decide

_NAME = re.compile(r"\bNodeName=(\S+)")
_STATE = re.compile(r"\bState=(\S+)")
_REASON = re.compile(r"\bReason=(.*?)(?=\s+\w+=|$)")


def judge_nodes(nodes: Sequence[str], show_node: str, job_nodes: Collection[str] | None,
                job_id: str = "") -> dict[str, str]:
    """{node: what Slurm says} for each of ``nodes`` that a job step must not use, given the
    output of ``scontrol --oneliner show node`` (one line per node) and the nodes the job still
    holds (None: not known)."""
    states: dict[str, tuple[str, str]] = {}
    for line in show_node.splitlines():
        name, state = _NAME.search(line), _STATE.search(line)
        if name and state:
            reason = _REASON.search(line)
            states[name.group(1)] = (state.group(1), reason.group(1).strip() if reason else "")
    job = f"job {job_id}" if job_id else "the job"
    verdict: dict[str, str] = {}
    for node in nodes:
        if job_nodes is not None and node not in job_nodes:
            verdict[node] = f"Slurm took it out of {job}"
        if node not in states:
            verdict.setdefault(node, "Slurm does not know it")
            continue
        state, reason = states[node]
        if any(word in UNUSABLE for word in state.split("+")):
            said = f"Slurm says State={state}" + (f", Reason={reason}" if reason and reason != "(null)" else "")
            verdict[node] = f"{verdict[node]}; {said}" if node in verdict else said
    return verdict


def unusable_nodes(nodes: Sequence[str], job_id: str | None) -> dict[str, str]:
    """{node: what Slurm says} for the nodes a job step must not use (:func:`judge_nodes`), as
    Slurm says now. Empty when Slurm cannot be asked: the nodes' agents are checked either way."""
    if not nodes:
        return {}
    try:
        shown = slurm_run(["scontrol", "--oneliner", "show", "node", ",".join(nodes)], what="node states",
                          timeout=QUERY_TIMEOUT)
        held = None
        if job_id:
            hostlist = slurm_run(["squeue", "-h", "-j", job_id, "-o", "%N"], what=f"job {job_id}'s nodes",
                                 timeout=QUERY_TIMEOUT).strip()
            held = set(expand_hostlist(hostlist)) if hostlist else None
    except SlurmError:
        return {}
    return judge_nodes(nodes, shown, held, job_id or "")
